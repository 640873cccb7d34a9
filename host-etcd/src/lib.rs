//! The watchcache etcd host (work in progress: issue 3).
