//! Fuzz target `fuse_ramfs`: see `virtiofs_fuzz_common::fuse_ramfs` for what the input means.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| virtiofs_fuzz_common::fuse_ramfs(data));
