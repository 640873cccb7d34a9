//! The `watchcache` server (work in progress: issue 3).
fn main() {}
