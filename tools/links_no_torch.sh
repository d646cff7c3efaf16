#!/bin/sh
# Fails when the binary $1 loads libtorch (or its c10, caffe2 or OpenMP runtime), directly or
# through a library it links: pswitchd never builds a model (issue 28).
set -u
deps=$(ldd "$1") || { echo "ldd $1 failed" >&2; exit 1; }
echo "$deps"
if echo "$deps" | grep -E 'libtorch|libc10|libcaffe2|libgomp'; then
  echo "$1 loads libtorch or its runtime (above)" >&2
  exit 1
fi
echo "$1 loads no libtorch"
