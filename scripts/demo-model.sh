#!/usr/bin/env bash
# Makes the bundled demo model models/ms4-tiny256-q2k.gguf (models/README.md): the q2k fixture
# of shared/fixtures/models/ (written by llama.cpp, tests/data/models/README.md) with its
# `mistral4.context_length` set to 4096 in place by gguf-py's gguf-set-metadata (PyPI gguf
# 0.19.0, the version that wrote the fixtures), which rewrites the value's four bytes and nothing
# else.
#
#   scripts/demo-model.sh [SOURCE]  write models/ms4-tiny256-q2k.gguf from SOURCE (default
#                                   ../shared/fixtures/models/ms4-tiny256-q2k.gguf), after checking
#                                   that its sha256 is the one the fixture's references name
#                                   (`model_sha256` of tests/data/models/ms4-tiny256-q2k.*.json)
#   scripts/demo-model.sh --check   without shared/: exit 1 unless the committed file, with the key
#                                   set back to 256, has that sha256, and the file is what this
#                                   script writes from it
# Needs python3 with venv and PyPI (gguf is installed in target/demo-model-venv).
set -euo pipefail
cd "$(dirname "$0")/.."
demo=models/ms4-tiny256-q2k.gguf
key=mistral4.context_length
context=4096
fixture_context=256
refs=tests/data/models/ms4-tiny256-q2k.transformers-dequant.logits.json

venv=target/demo-model-venv
if [ ! -x $venv/bin/gguf-set-metadata ]; then
    python3 -m venv $venv
    $venv/bin/pip install -q 'gguf==0.19.0'
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/demo-model.XXXXXX")
trap 'rm -rf "$work"' EXIT

# rekey SRC VALUE OUT: OUT is SRC with the key set to VALUE.
rekey() {
    cp "$1" "$3"
    chmod u+w "$3"
    $venv/bin/gguf-set-metadata "$3" $key "$2" --force 2>&1 | sed 's/^/demo-model: /'
}

# is_fixture FILE: FILE has the sha256 the fixture's references were made from.
is_fixture() {
    local want got
    want=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["model_sha256"])' "$refs")
    got=$(sha256sum "$1" | cut -d' ' -f1)
    if [ "$got" != "$want" ]; then
        echo "demo-model: $2 has sha256 $got, but $refs was made from $want" >&2
        return 1
    fi
}

if [ "${1:-}" = "--check" ]; then
    rekey $demo $fixture_context "$work/fixture.gguf"
    is_fixture "$work/fixture.gguf" "$demo with $key $fixture_context"
    rekey "$work/fixture.gguf" $context "$work/demo.gguf"
    if ! cmp -s "$work/demo.gguf" $demo; then
        echo "demo-model: $demo is not the fixture with $key $context (run scripts/demo-model.sh)" >&2
        exit 1
    fi
    echo "demo-model: $demo is the fixture with $key $context"
else
    src=${1:-../shared/fixtures/models/ms4-tiny256-q2k.gguf}
    is_fixture "$src" "$src"
    rekey "$src" $context "$work/demo.gguf"
    cp "$work/demo.gguf" $demo
    sha256sum $demo
fi
