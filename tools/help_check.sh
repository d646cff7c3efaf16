#!/bin/bash
# Every binary's --help lists its own flags, each with its default (issue 28). Usage:
#   help_check.sh BIN_DIR tool...
set -u
bin=$1
shift
rc=0
for tool in "$@"; do
  out=$("$bin/$tool" --help 2>&1)
  if grep -q "No flags matched" <<<"$out" || ! grep -q "default:" <<<"$out"; then
    echo "FAIL $tool --help lists no flags with their defaults:"
    head -5 <<<"$out"
    rc=1
  else
    echo "ok   $tool: $(grep -c "default:" <<<"$out") flags"
  fi
done
exit "$rc"
