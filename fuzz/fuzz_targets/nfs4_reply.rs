//! Fuzz target `nfs4_reply`: see `virtiofs_fuzz_common::nfs4` for what the input means.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| virtiofs_fuzz_common::nfs4_reply(data));
