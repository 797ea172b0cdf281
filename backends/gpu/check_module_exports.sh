#!/bin/sh
# Fails unless a backend module's only defined dynamic symbol is kvhal_backend_entry (see kvhal_gpu_module.map).
set -eu
mod="$1"
syms=$(nm -D --defined-only "$mod" | awk '$2 ~ /^[TDBRVWiu]$/ {print $3}')
if [ "$syms" != "kvhal_backend_entry" ]; then
  echo "$mod exports more or less than kvhal_backend_entry:"
  echo "$syms"
  exit 1
fi
echo "exports ok: $mod defines only kvhal_backend_entry"
