//! Fuzz target `nfs_reply`: see `virtiofs_fuzz_common::nfs` for what the input means.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| virtiofs_fuzz_common::nfs_reply(data));
