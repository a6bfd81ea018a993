//! Fuzz target `fuse_passthrough`: see `virtiofs_fuzz_common::fuse_passthrough` for what the input means.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| virtiofs_fuzz_common::fuse_passthrough(data));
