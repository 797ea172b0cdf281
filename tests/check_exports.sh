#!/bin/sh
# Fails unless every dynamic symbol libkvhal defines starts with kvhal_ (hidden visibility for the rest).
lib="$1"
bad=$(nm -D --defined-only "$lib" | awk '$2 ~ /^[TDBRVW]$/ {print $3}' | grep -v '^kvhal_' | grep -v '^_init$\|^_fini$')
count=$(nm -D --defined-only "$lib" | awk '$2 ~ /^[TDBRVW]$/ {print $3}' | grep -c '^kvhal_')
if [ -n "$bad" ]; then echo "non-kvhal exports:"; echo "$bad"; exit 1; fi
if [ "$count" -lt 20 ]; then echo "only $count kvhal_ exports: visibility broken?"; exit 1; fi
echo "exports ok: $count kvhal_* symbols, nothing else"
