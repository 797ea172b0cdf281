#!/bin/bash
# Session 5's one-GPU run, superseded by session6-gpu.sh (the same parts, the same PART names, plus `ocl`; a build
# kept in ./build-gpu6). The script exactly as session 5 ran it is in git history: `git show 2e301dd:docs/measurements/scripts/session5-gpu.sh`.
exec bash "$(dirname "$0")/session6-gpu.sh" "$@"
