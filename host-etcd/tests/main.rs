//! The host's integration tests, in one test binary: each module below was a test target of its
//! own, and each linked the whole server again (about 60 MB apiece in a debug build). One binary
//! links once. `cargo test -p host-etcd --test integration <module>::` runs one module's tests.

mod support;

mod bad_input;
mod etcd_api;
mod etcd_cache_features;
mod etcdctl;
mod faults;
mod kube_http;
mod latency;
mod layers;
mod leader;
mod library;
mod random_requests;
mod random_slow_readers;
mod restart;
mod security;
mod slo_validation;
