//! Fuzz target `vfio_user`: see `virtiofs_fuzz_common::vfio_user` for what the input means.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| virtiofs_fuzz_common::vfio_user(data));
