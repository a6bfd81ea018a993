//! Fuzz target `virtq`: see `virtiofs_fuzz_common::virtq` for what the input means.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| virtiofs_fuzz_common::virtq(data));
