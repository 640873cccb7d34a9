#![no_main]
//! Fuzz target: cacher_core::fuzzing::selector.
libfuzzer_sys::fuzz_target!(|data: &[u8]| cacher_core::fuzzing::selector(data));
