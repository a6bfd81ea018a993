#!/usr/bin/env bash
# The project's test command (README, .ci/run): every Rust test in the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace --all-targets
