#!/usr/bin/env bash
# Installs the command-line tools the tests use into DIR/bin (default .tools/bin).
set -euo pipefail
dir="${1:-.tools}"
mkdir -p "$dir/bin"
