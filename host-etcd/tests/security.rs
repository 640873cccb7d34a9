//! Security: with etcd auth on, no client reads from the cache what etcd would refuse it (the
//! decision is etcd's, cached briefly); with client TLS configured, only clients with a
//! certificate from the configured CA connect.

use crate::support;

use std::time::Duration;

use etcd_client::proto::{PbRangeRequest, PbWatchRequest, PbWatchRequestUnion};
use etcd_client::{
    Certificate, ConnectOptions, GetOptions, Identity, Permission, TlsOptions, WatchOptions,
};
use host_etcd::{EtcdOptions, ServerTls};
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use support::Env;

fn norm<T>(r: Result<T, etcd_client::Error>) -> Result<(), (tonic::Code, String)> {
    match r {
        Ok(_) => Ok(()),
        Err(etcd_client::Error::GRpcStatus(s)) => Err((s.code(), s.message().to_owned())),
        Err(e) => Err((tonic::Code::Unknown, e.to_string())),
    }
}

/// Turns etcd's auth on with `root` (password `rootpw`) and `alice` (`alicepw`), who may read
/// the prefixes `readable`; then starts watchcache on `prefixes` as root.
async fn with_auth(
    etcd: &host_etcd::EmbeddedEtcd,
    readable: &[&str],
    prefixes: &[&str],
) -> host_etcd::Server {
    enable_auth(etcd, readable).await;
    let server = start_as_root(etcd, prefixes).await;
    assert!(server.wait_ready(Duration::from_secs(10)).await);
    server
}

/// Turns etcd's auth on with `root` and `alice`, who may read the prefixes `readable`.
async fn enable_auth(etcd: &host_etcd::EmbeddedEtcd, readable: &[&str]) {
    let mut admin = support::connect(&etcd.endpoint(), None).await;
    admin.user_add("root", "rootpw", None).await.expect("root");
    admin.user_grant_role("root", "root").await.expect("root role");
    admin.role_add("reader").await.expect("role");
    for p in readable {
        admin
            .role_grant_permission("reader", Permission::read(*p).with_prefix())
            .await
            .expect("grant");
    }
    admin.user_add("alice", "alicepw", None).await.expect("alice");
    admin.user_grant_role("alice", "reader").await.expect("alice role");
    admin.auth_enable().await.expect("auth on");
}

/// alice's token, from `endpoint` (etcd, or watchcache, which passes Authenticate on).
async fn alice_token(endpoint: &str) -> String {
    let c = support::connect(endpoint, None).await;
    let r = c.auth_client().authenticate("alice".into(), "alicepw".into()).await;
    r.expect("authenticate").token().to_owned()
}

/// A raw Watch stream on `grpc` with alice's token, opened with a progress request (which a
/// stream without watches never gets answered, over etcd neither).
async fn alice_raw_stream(grpc: &str) -> support::RawWatch {
    let progress = PbWatchRequest {
        request_union: Some(PbWatchRequestUnion::ProgressRequest(Default::default())),
    };
    support::RawWatch::open(grpc, Some(("token", alice_token(grpc).await)), progress).await
}

/// Starts watchcache on `prefixes` as root (not waiting for its caches).
async fn start_as_root(etcd: &host_etcd::EmbeddedEtcd, prefixes: &[&str]) -> host_etcd::Server {
    let mut cfg = support::test_config(etcd);
    cfg.prefixes = prefixes.iter().map(|p| p.as_bytes().to_vec()).collect();
    cfg.upstream.user = Some(("root".into(), "rootpw".into()));
    host_etcd::Server::start(cfg).await.expect("watchcache")
}

/// Auth turned on through the cache counts at once: the next cached read is checked with
/// etcd, and refused as etcd refuses it. Before, auth counted as off until the cache read
/// etcd's state again, 20 ms after the call's answer and a round trip later; and through
/// etcd's JSON gateway on the same port (HTTP/1, spliced to etcd), until the next
/// `AuthStatus`, up to 10 s later. Rounds 0–2 turn it on over gRPC, 3–5 through the gateway.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_turned_on_through_the_cache_counts_at_once() {
    let etcd = host_etcd::EmbeddedEtcd::start(EtcdOptions::default()).await.expect("etcd");
    let mut admin = support::connect(&etcd.endpoint(), None).await;
    admin.put("/b/1", "secret", None).await.expect("put");
    admin.user_add("root", "rootpw", None).await.expect("root");
    admin.user_grant_role("root", "root").await.expect("root role");
    let mut cfg = support::test_config(&etcd);
    cfg.prefixes = vec![b"/".to_vec()];
    let server = host_etcd::Server::start(cfg).await.expect("watchcache");
    assert!(server.wait_ready(Duration::from_secs(10)).await);
    let mut cached = support::connect(&server.grpc_addr().to_string(), None).await;
    // Serializable: answered from the cache with no call to etcd (a linearizable read asks
    // etcd for its revision first, as the cache's user).
    let serializable = || Some(GetOptions::new().with_serializable());
    assert_eq!(norm(cached.get("/b/1", serializable()).await), Ok(()), "auth is off");
    let grpc = server.grpc_addr().to_string();
    for round in 0..6 {
        if round < 3 {
            cached.auth_enable().await.expect("auth on");
        } else {
            let (status, body) = support::http1(&grpc, "POST", "/v3/auth/enable", "{}").await;
            assert_eq!(status, 200, "the gateway's AuthEnable: {body}");
        }
        let got = norm(cached.get("/b/1", serializable()).await);
        let direct = norm(admin.get("/b/1", serializable()).await);
        assert!(direct.is_err(), "etcd refuses a client without a token");
        assert_eq!(got, direct, "round {round}: right after AuthEnable");
        let root_opts = ConnectOptions::new().with_user("root", "rootpw");
        let mut root = support::connect(&grpc, Some(root_opts)).await;
        root.auth_disable().await.expect("auth off");
        tokio::time::sleep(Duration::from_millis(200)).await;
        let got = norm(cached.get("/b/1", serializable()).await);
        assert_eq!(got, Ok(()), "round {round}: auth off");
    }
    server.shutdown().await;
}

/// Whether auth is on is asked of etcd (`AuthStatus`, at the start and every 10 s): until etcd
/// has said it is off, each cached read is checked with etcd. Before, auth counted as off
/// until etcd's first answer, so a start whose first `AuthStatus` found etcd unreachable
/// served cached reads to anyone for the next 10 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn until_etcd_says_auth_is_off_cached_reads_are_checked() {
    use host_etcd::server::auth::AuthChecker;
    let mut etcd = host_etcd::EmbeddedEtcd::start(EtcdOptions::default()).await.expect("etcd");
    let mut admin = support::connect(&etcd.endpoint(), None).await;
    admin.put("/b/1", "secret", None).await.expect("put");
    enable_auth(&etcd, &["/a/"]).await;
    let mut cfg = support::test_config(&etcd);
    cfg.upstream.user = Some(("root".into(), "rootpw".into()));
    let upstream = host_etcd::upstream::Upstream::connect(&cfg.upstream).await.expect("upstream");
    etcd.kill().await;
    let checker = AuthChecker::new(upstream, Duration::from_secs(5), Default::default());
    checker.refresh().await; // etcd is down: no answer
    etcd.restart(EtcdOptions::default()).await.expect("etcd restarts");
    let mut md = tonic::metadata::MetadataMap::new();
    md.insert("token", alice_token(&etcd.endpoint()).await.parse().expect("token"));
    let refused = checker.check(&md, b"/b/1", b"").await;
    assert_eq!(refused.map_err(|s| s.code()), Err(tonic::Code::PermissionDenied));
    assert!(checker.check(&md, b"/a/1", b"").await.is_ok(), "alice may read /a/");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_auth_on_the_cache_refuses_what_etcd_refuses() {
    let etcd = host_etcd::EmbeddedEtcd::start(EtcdOptions::default()).await.expect("etcd");
    let mut admin = support::connect(&etcd.endpoint(), None).await;
    admin.put("/a/1", "one", None).await.expect("put");
    admin.put("/b/1", "secret", None).await.expect("put");
    let server = with_auth(&etcd, &["/a/"], &["/"]).await;
    let grpc = server.grpc_addr().to_string();
    let alice = || ConnectOptions::new().with_user("alice", "alicepw");
    let mut direct = support::connect(&etcd.endpoint(), Some(alice())).await;
    let mut cached = support::connect(&grpc, Some(alice())).await;

    // Allowed: the same answer, from the cache.
    let d = direct.get("/a/", Some(GetOptions::new().with_prefix())).await.expect("allowed");
    let w = cached.get("/a/", Some(GetOptions::new().with_prefix())).await.expect("allowed");
    assert_eq!(d.kvs().len(), w.kvs().len());
    // Refused: the same refusal.
    for (key, opts) in [
        ("/b/", Some(GetOptions::new().with_prefix())),
        ("/b/1", None),
        ("/", Some(GetOptions::new().with_prefix())),
    ] {
        let d = norm(direct.get(key, opts.clone()).await);
        let w = norm(cached.get(key, opts).await);
        assert!(d.is_err(), "etcd refuses {key}");
        assert_eq!(d, w, "{key}");
    }
    // Watches: refused the same way, allowed ones get events.
    for (key, allowed) in [("/b/", false), ("/a/", true)] {
        let mut answers = Vec::new();
        for c in [&mut direct, &mut cached] {
            let mut s =
                c.watch(key, Some(WatchOptions::new().with_prefix())).await.expect("stream");
            let m = s.message().await.expect("ok").expect("msg");
            answers.push((m.watch_id(), m.created(), m.canceled(), m.cancel_reason().to_owned()));
        }
        assert_eq!(answers[0], answers[1], "watch {key}");
        assert_eq!(answers[1].2, !allowed, "watch {key}: {:?}", answers[1]);
    }
    // On one stream, a refused create takes no id (etcd answers it with -1): the allowed create
    // after it gets 0, and its events come under 0.
    let mut ids = Vec::new();
    for c in [&mut direct, &mut cached] {
        let all = || Some(WatchOptions::new().with_prefix());
        let mut s = c.watch("/b/", all()).await.expect("stream");
        s.watch("/a/", all()).await.expect("create");
        let refused = s.message().await.expect("ok").expect("msg");
        let created = s.message().await.expect("ok").expect("msg");
        ids.push((refused.watch_id(), refused.canceled(), created.watch_id(), created.canceled()));
    }
    assert_eq!(ids[0], (-1, true, 0, false), "etcd");
    assert_eq!(ids[1], ids[0], "watchcache against etcd");
    // etcd asks the permission before it looks at the range or the id: a malformed create on
    // a range the client may not read is refused for permission, one it may read for itself.
    let mut answers = Vec::new();
    for c in [&mut direct, &mut cached] {
        let five = || WatchOptions::new().with_watch_id(5);
        let mut s = c.watch("/a/", Some(five().with_prefix())).await.expect("stream");
        let m = s.message().await.expect("ok").expect("msg");
        let mut got = vec![(m.watch_id(), m.canceled(), m.cancel_reason().to_owned())];
        for (key, opts) in [
            ("/b/2", WatchOptions::new().with_range("/b/1")),
            ("/a/2", WatchOptions::new().with_range("/a/1")),
            ("/b/", five().with_prefix()),
            ("/a/x", five()),
        ] {
            s.watch(key, Some(opts)).await.expect("create");
            let m = s.message().await.expect("ok").expect("msg");
            got.push((m.watch_id(), m.canceled(), m.cancel_reason().to_owned()));
        }
        answers.push(got);
    }
    let reasons: Vec<&str> = answers[0].iter().map(|a| a.2.as_str()).collect();
    assert_eq!(
        reasons,
        [
            "",
            "rpc error: code = PermissionDenied desc = etcdserver: permission denied",
            "mvcc: watcher range is empty",
            "rpc error: code = PermissionDenied desc = etcdserver: permission denied",
            "mvcc: duplicate watch ID provided on the WatchStream"
        ],
        "etcd"
    );
    assert_eq!(answers[1], answers[0], "watchcache against etcd");
    // No credentials at all: refused as etcd refuses.
    let mut anon_direct = support::connect(&etcd.endpoint(), None).await;
    let mut anon_cached = support::connect(&grpc, None).await;
    let d = norm(anon_direct.get("/a/1", None).await);
    let w = norm(anon_cached.get("/a/1", None).await);
    assert!(d.is_err());
    assert_eq!(d, w);
    // Decisions are reused for a while, not asked of etcd every time.
    for _ in 0..10 {
        cached.get("/a/", Some(GetOptions::new().with_prefix())).await.expect("allowed");
    }
    let http = format!("http://{}/metrics", server.http_addr().expect("http"));
    let from_cache =
        support::metric(&http, "watchcache_auth_checks_total", "source=\"cache\"").await;
    assert!(from_cache >= 10.0, "decisions reused: {from_cache}");
    // A permission revoked through the cache takes effect at once.
    let mut root =
        support::connect(&grpc, Some(ConnectOptions::new().with_user("root", "rootpw"))).await;
    root.role_revoke_permission(
        "reader",
        "/a/",
        Some(etcd_client::RoleRevokePermissionOptions::new().with_prefix()),
    )
    .await
    .expect("revoke");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let d = norm(direct.get("/a/", Some(GetOptions::new().with_prefix())).await);
    let w = norm(cached.get("/a/", Some(GetOptions::new().with_prefix())).await);
    assert!(d.is_err(), "revoked");
    assert_eq!(d, w);
    // The HTTP API asks for credentials too.
    let base = format!("http://{}", server.http_addr().expect("http"));
    let r = support::http::get(format!("{base}/kube/b/")).await.expect("request");
    assert_eq!(r.status(), 401);
    let r = support::http::Client::new()
        .get_basic_auth(format!("{base}/kube/b/"), "alice", "alicepw")
        .await
        .expect("request");
    assert_eq!(r.status(), 403);
    let r = support::http::Client::new()
        .get_basic_auth(format!("{base}/kube/b/"), "root", "rootpw")
        .await
        .expect("request");
    assert_eq!(r.status(), 200);
    server.shutdown().await;
}

/// etcd takes a client's token from the `token` metadata or, without it, from
/// `authorization` (`Bearer ` optional; `auth/store.go` `AuthInfoFromCtx`): a decision the
/// cache reuses is the one for that token, whichever header carried it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_in_the_authorization_header_is_that_clients_alone() {
    let etcd = host_etcd::EmbeddedEtcd::start(EtcdOptions::default()).await.expect("etcd");
    let mut admin = support::connect(&etcd.endpoint(), None).await;
    for k in ["/a/1", "/a/2"] {
        admin.put(k, "v", None).await.expect("put");
    }
    let server = with_auth(&etcd, &["/a/"], &["/"]).await;
    let (direct, cached) = (etcd.endpoint(), server.grpc_addr().to_string());
    let alice =
        support::connect(&direct, Some(ConnectOptions::new().with_user("alice", "alicepw"))).await;
    let token =
        alice.auth_client().authenticate("alice".into(), "alicepw".into()).await.expect("token");
    let token = token.token().to_owned();

    // (header, key) in an order where a decision cached for one client would answer the next.
    let bearer = || Some(("authorization", format!("Bearer {token}")));
    let bare = || Some(("authorization", token.clone()));
    let steps = [
        ("anonymous", None, "/a/1"),
        ("alice, Bearer", bearer(), "/a/1"),
        ("alice, Bearer", bearer(), "/a/2"),
        ("anonymous", None, "/a/2"),
        ("alice, no Bearer", bare(), "/a/2"),
        ("a stranger", Some(("authorization", "Bearer nonsense".to_owned())), "/a/2"),
        ("alice, token", Some(("token", token.clone())), "/a/2"),
    ];
    for (who, header, key) in steps {
        let range = || PbRangeRequest { key: key.into(), ..Default::default() };
        let d = support::range_with_metadata(&direct, range(), header.clone()).await;
        let w = support::range_with_metadata(&cached, range(), header).await;
        assert_eq!(d, w, "{who} reading {key}");
    }
    server.shutdown().await;
}

/// With etcd down, a create whose permission etcd cannot be asked about gets no answer, and
/// never events of a range the client may not read. Found by the robustness suite's auth mode:
/// such a watch was announced when its relay to the stopped etcd failed, then served from the
/// cache, secrets and all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_etcd_down_a_create_it_cannot_decide_gets_no_answer_and_no_events() {
    let mut etcd = host_etcd::EmbeddedEtcd::start(EtcdOptions::default()).await.expect("etcd");
    let mut admin = support::connect(&etcd.endpoint(), None).await;
    let first = admin.put("/b/1", "secret", None).await.expect("put");
    let first = first.header().expect("header").revision();
    admin.put("/b/2", "secret", None).await.expect("put");
    let server = with_auth(&etcd, &["/a/"], &["/"]).await;
    let grpc = server.grpc_addr().to_string();
    // Opened while etcd is up.
    let mut s = alice_raw_stream(&grpc).await;

    etcd.kill().await;
    // From the first revision: the cache's window holds every secret.
    s.send(WatchOptions::new().with_prefix().with_key("/b/").with_start_revision(first).into());
    let early = tokio::time::timeout(Duration::from_secs(3), s.next()).await;
    assert!(early.is_err(), "an answer before etcd could decide: {early:?}");

    etcd.restart(EtcdOptions::default()).await.expect("etcd restarts");
    // etcd replays alice's Authenticate from its log (no snapshot came after it) and refuses
    // the create; had it forgotten the token, the stream would end, as the restart ends it
    // over etcd itself.
    match tokio::time::timeout(Duration::from_secs(20), s.next()).await {
        Ok(Ok(m)) => {
            assert!(m.created && m.canceled && m.watch_id == -1, "{m:?}");
            assert!(m.events.is_empty(), "{m:?}");
            assert!(m.cancel_reason.contains("permission denied"), "{m:?}");
        }
        Ok(Err(st)) => assert_eq!(st.code(), tonic::Code::Unavailable, "{st:?}"),
        Err(_) => panic!("no answer once etcd was back"),
    }
    server.shutdown().await;
}

/// etcd's simple tokens expire when unused for `--auth-token-ttl` (and after a restart, unless
/// etcd replays their Authenticate). watchcache's own client then authenticates again, and a
/// client's watch, whose permission etcd checked when it was created, goes on as over etcd
/// itself: etcd never checks a watch's permission again, and a client of etcd would reconnect
/// and authenticate again, while watchcache's client never saw the restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_auth_on_expired_tokens_and_an_etcd_restart_lose_no_watch_and_no_read() {
    support::init_tracing();
    let opts = || EtcdOptions {
        extra_args: vec!["--auth-token-ttl=2".into(), "--snapshot-count=1".into()],
        ..Default::default()
    };
    let mut etcd = host_etcd::EmbeddedEtcd::start(opts()).await.expect("etcd");
    let mut admin = support::connect(&etcd.endpoint(), None).await;
    admin.put("/a/1", "v", None).await.expect("put");
    let server = with_auth(&etcd, &["/a/", "/b/"], &["/a/"]).await;
    let grpc = server.grpc_addr().to_string();
    // As clientv3 does, alice's client authenticates again when told its token is invalid.
    let alice_opts =
        ConnectOptions::new().with_user("alice", "alicepw").with_auto_token_refresh(true);
    let mut alice = support::connect(&grpc, Some(alice_opts)).await;
    // One watch from the cache, one outside the cached prefix (relayed to etcd).
    let all = || Some(WatchOptions::new().with_prefix());
    let mut cached = alice.watch("/a/", all()).await.expect("watch");
    let mut relayed = alice.watch("/b/", all()).await.expect("watch");
    for s in [&mut cached, &mut relayed] {
        let m = s.message().await.expect("ok").expect("created");
        assert!(m.created() && !m.canceled(), "{m:?}");
    }

    // Round 1 with auth turned off on etcd, which then refuses to authenticate anyone (and
    // reads no token): the relay cannot get a token of the cache's own. Rounds 2 and 3 with
    // auth on again; in round 3 the token the cache opened the relay with in round 2 has
    // expired too (it authenticates again when etcd refuses it).
    let root =
        || Some(ConnectOptions::new().with_user("root", "rootpw").with_auto_token_refresh(true));
    let mut idle = None;
    for round in 1..=3 {
        let auth_on = round != 1;
        if round == 3 {
            // A stream that has only asked for progress when etcd restarts: etcd never took
            // its token on it before forgetting it.
            idle = Some(alice_raw_stream(&grpc).await);
        }
        let mut admin = match round {
            1 => {
                let mut c = support::connect(&etcd.endpoint(), root()).await;
                c.auth_disable().await.expect("auth off");
                c
            }
            2 => {
                let mut c = support::connect(&etcd.endpoint(), None).await;
                c.auth_enable().await.expect("auth on again");
                support::connect(&etcd.endpoint(), root()).await
            }
            _ => support::connect(&etcd.endpoint(), root()).await,
        };
        // Every token unused for longer than etcd's TTL is gone, watchcache's and alice's, and
        // with a snapshot after their Authenticate requests (`--snapshot-count=1`), the
        // restart does not bring them back by replaying them.
        for i in 0..4 {
            admin.put(format!("/c/{i}"), "x", None).await.expect("put");
        }
        tokio::time::sleep(Duration::from_secs(4)).await;
        etcd.restart(opts()).await.expect("etcd restarts");
        let mut admin =
            support::connect(&etcd.endpoint(), if auth_on { root() } else { None }).await;
        let value = format!("after restart {round}");
        let (ra, rb) = (
            support::put(&mut admin, "/a/2", value.clone()).await,
            support::put(&mut admin, "/b/2", value.clone()).await,
        );
        for (name, s, rev) in [("cached", &mut cached, ra), ("relayed", &mut relayed, rb)] {
            let got = tokio::time::timeout(Duration::from_secs(15), async {
                loop {
                    let m = s.message().await.expect("ok").expect("a response");
                    assert!(!m.canceled(), "{name}, round {round}: cancelled: {m:?}");
                    if let Some(e) = m
                        .events()
                        .iter()
                        .find(|e| e.kv().is_some_and(|kv| kv.mod_revision() == rev))
                    {
                        return e.kv().map(|kv| kv.value().to_vec());
                    }
                }
            })
            .await
            .unwrap_or_else(|_| panic!("{name}, round {round}: no event after etcd's restart"));
            assert_eq!(got.as_deref(), Some(value.as_bytes()), "{name}, round {round}");
        }
        // A linearizable read through the cache needs etcd's revision, read with the cache's
        // own (new) token.
        let r = alice.get("/a/2", None).await.expect("linearizable read through the cache");
        assert_eq!(r.kvs().first().map(|kv| kv.value()), Some(value.as_bytes()), "round {round}");
    }
    // etcd has forgotten the token alice's two streams were opened with, and took once. Over
    // etcd itself the restart would have broken them, and clientv3 authenticates for every new
    // stream; through the cache they are still open, so a new create on either ends its
    // stream as a broken one (Unavailable), where a cancel would refuse the watch for good.
    for (name, s, key) in [("cached", &mut cached, "/a/x"), ("relayed", &mut relayed, "/b/x")] {
        s.watch(key, None).await.expect("create");
        let end = tokio::time::timeout(Duration::from_secs(15), async {
            loop {
                match s.message().await {
                    Ok(Some(m)) => assert!(!m.canceled(), "{name}: refused, not ended: {m:?}"),
                    Ok(None) => panic!("{name}: the stream ended without a status"),
                    Err(e) => return e,
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{name}: the stream went on"));
        match end {
            etcd_client::Error::GRpcStatus(s) => {
                assert_eq!(s.code(), tonic::Code::Unavailable, "{name}: {s:?}")
            }
            e => panic!("{name}: {e}"),
        }
    }
    let mut idle = idle.expect("opened in round 3");
    idle.send(WatchOptions::new().with_prefix().with_key("/a/").into());
    match tokio::time::timeout(Duration::from_secs(15), idle.next()).await {
        Ok(Err(s)) => assert_eq!(s.code(), tonic::Code::Unavailable, "idle: {s:?}"),
        Ok(Ok(m)) => panic!("idle: refused, not ended: {m:?}"),
        Err(_) => panic!("idle: no answer"),
    }
    server.shutdown().await;
}

struct Pki {
    ca_pem: String,
    server: (String, String),
    client: (String, String),
    stranger: (String, String),
}

fn pki() -> Pki {
    let ca_key = KeyPair::generate().expect("key");
    let mut ca = CertificateParams::new(Vec::<String>::new()).expect("params");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key).expect("ca");
    let issuer = Issuer::new(ca, ca_key);
    let leaf = |names: Vec<String>, issuer: &Issuer<'_, KeyPair>| {
        let key = KeyPair::generate().expect("key");
        let cert =
            CertificateParams::new(names).expect("params").signed_by(&key, issuer).expect("sign");
        (cert.pem(), key.serialize_pem())
    };
    let server = leaf(vec!["localhost".into(), "127.0.0.1".into()], &issuer);
    let client = leaf(vec!["client".into()], &issuer);
    let other_key = KeyPair::generate().expect("key");
    let mut other = CertificateParams::new(Vec::<String>::new()).expect("params");
    other.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let other_issuer = Issuer::new(other, other_key);
    let stranger = leaf(vec!["stranger".into()], &other_issuer);
    Pki { ca_pem: ca_cert.pem(), server, client, stranger }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_client_tls_only_clients_of_the_ca_connect() {
    let p = pki();
    let env = Env::start_with(EtcdOptions::default(), |cfg| {
        cfg.tls = Some(ServerTls {
            cert_pem: p.server.0.clone().into_bytes(),
            key_pem: p.server.1.clone().into_bytes(),
            client_ca_pem: Some(p.ca_pem.clone().into_bytes()),
        });
    })
    .await;
    let url = format!("https://{}", env.grpc());
    let tls = |id: Option<&(String, String)>| {
        let mut t = TlsOptions::new()
            .ca_certificate(Certificate::from_pem(&p.ca_pem))
            .domain_name("localhost");
        if let Some((c, k)) = id {
            t = t.identity(Identity::from_pem(c, k));
        }
        ConnectOptions::new()
            .with_tls(t)
            .with_connect_timeout(Duration::from_secs(3))
            .with_timeout(Duration::from_secs(3))
    };
    let mut good = etcd_client::Client::connect([url.as_str()], Some(tls(Some(&p.client))))
        .await
        .expect("client of the CA");
    good.put("/t/1", "x", None).await.expect("write through TLS");
    assert_eq!(good.get("/t/1", None).await.expect("read").kvs().len(), 1);
    for (name, id) in [("no certificate", None), ("another CA's certificate", Some(&p.stranger))] {
        let r = match etcd_client::Client::connect([url.as_str()], Some(tls(id))).await {
            Ok(mut c) => c.get("/t/1", None).await.map(|_| ()),
            Err(e) => Err(e),
        };
        assert!(r.is_err(), "{name}: must not connect");
    }
    // Plain text is refused too.
    let plain = etcd_client::Client::connect(
        [format!("http://{}", env.grpc())],
        Some(ConnectOptions::new().with_timeout(Duration::from_secs(2))),
    )
    .await;
    let r = match plain {
        Ok(mut c) => c.get("/t/1", None).await.map(|_| ()),
        Err(e) => Err(e),
    };
    assert!(r.is_err(), "plain text must not work");
    // etcd's HTTP endpoints over TLS, as on etcd's own TLS port: HTTP/1 agreed by ALPN is
    // spliced to etcd; without a certificate of the CA, no handshake.
    let health = https1(&env.grpc(), &p.ca_pem, Some(&p.client), "/health").await;
    let health = health.expect("GET /health over TLS");
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    assert!(health.ends_with(r#"{"health":"true","reason":""}"#), "{health}");
    let refused = https1(&env.grpc(), &p.ca_pem, None, "/health").await;
    assert!(refused.is_err(), "no certificate: {refused:?}");
}

/// A TLS connection to `addr` as `localhost`, trusting `ca_pem`, with `identity` as the
/// client's certificate, offering `alpn`.
async fn tls_connect(
    addr: &str,
    ca_pem: &str,
    identity: Option<&(String, String)>,
    alpn: &[&[u8]],
) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>, String> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    use std::sync::Arc;
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c.expect("CA")).expect("CA");
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("TLS")
        .with_root_certificates(roots);
    let mut config = match identity {
        Some((cert, key)) => {
            let certs = CertificateDer::pem_slice_iter(cert.as_bytes())
                .collect::<Result<Vec<_>, _>>()
                .expect("certificate");
            let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).expect("key");
            builder.with_client_auth_cert(certs, key).expect("identity")
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let tcp = tokio::net::TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let name = ServerName::try_from("localhost").expect("name");
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    connector.connect(name, tcp).await.map_err(|e| e.to_string())
}

/// One HTTP/1.1 GET over TLS (ALPN `http/1.1`), `Connection: close`: the whole answer.
async fn https1(
    addr: &str,
    ca_pem: &str,
    identity: Option<&(String, String)>,
    path: &str,
) -> Result<String, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tls_connect(addr, ca_pem, identity, &[b"http/1.1"]).await?;
    let req = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.map_err(|e| e.to_string())?;
    let mut out = String::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_string(&mut out))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    if out.is_empty() {
        return Err("no answer".into());
    }
    Ok(out)
}

/// An etcd with a plain-text client port (the one `Env` gives watchcache) and a TLS one
/// (returned) that asks for a client certificate of `p`'s CA; the directory holds the PEM
/// files, which etcd reads at each handshake.
fn etcd_with_a_tls_port(p: &Pki) -> (EtcdOptions, u16, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("dir");
    let file = |name: &str, pem: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, pem).expect("write");
        path.display().to_string()
    };
    let (cert, key, ca) = (
        file("server.pem", &p.server.0),
        file("server.key", &p.server.1),
        file("ca.pem", &p.ca_pem),
    );
    let free = || {
        std::net::TcpListener::bind("127.0.0.1:0").expect("port").local_addr().expect("addr").port()
    };
    let (plain, peer, secure) = (free(), free(), free());
    let opts = EtcdOptions {
        ports: Some((plain, peer)),
        extra_args: vec![
            format!("--listen-client-urls=http://127.0.0.1:{plain},https://127.0.0.1:{secure}"),
            format!("--advertise-client-urls=http://127.0.0.1:{plain}"),
            format!("--cert-file={cert}"),
            format!("--key-file={key}"),
            format!("--trusted-ca-file={ca}"),
            "--client-cert-auth".into(),
        ],
        ..Default::default()
    };
    (opts, secure, dir)
}

/// watchcache in front of an etcd reached over TLS with a client certificate: gRPC goes
/// through, and so does HTTP/1 on watchcache's port (spliced to etcd over TLS): `/health`
/// answered by etcd, as etcd answers it on its own TLS port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn to_an_etcd_over_tls_grpc_and_http1_go_through() {
    let p = pki();
    let (opts, secure, _dir) = etcd_with_a_tls_port(&p);
    let env = Env::start_with(opts, |cfg| {
        cfg.upstream.endpoints = vec![format!("https://localhost:{secure}")];
        cfg.upstream.tls = Some(host_etcd::upstream::EtcdTls {
            ca_pem: Some(p.ca_pem.clone().into_bytes()),
            identity_pem: Some((p.client.0.clone().into_bytes(), p.client.1.clone().into_bytes())),
        });
    })
    .await;
    let mut c = env.cached().await;
    c.put("/t/1", "x", None).await.expect("a put through watchcache, over TLS to etcd");
    assert_eq!(c.get("/t/1", None).await.expect("get").kvs().len(), 1);
    let (status, body) = support::http1(&env.grpc(), "GET", "/health", "").await;
    assert_eq!(status, 200, "{body}");
    assert!(body.ends_with(r#"{"health":"true","reason":""}"#), "{body}");
    // An HTTP/2 request that is not gRPC (what curl sends once TLS agreed on h2) is passed
    // through to etcd, whose TLS port hands it to its HTTP handler.
    let (status, _, body) = support::h2_get(&env.grpc(), "/health").await;
    assert_eq!(status, 200);
    assert_eq!(&body[..], br#"{"health":"true","reason":""}"#);
}

/// HTTP/2 over TLS that is not gRPC (what `curl https://…/health` sends once ALPN agreed on
/// `h2`) gets etcd's own answer, as on etcd's TLS port, which hands it to etcd's HTTP handler
/// (`/health`, `/version`, the JSON gateway with its streaming watch). It must also when
/// watchcache reaches etcd in plain text, where etcd's port would give HTTP/2 to its gRPC
/// server: each answer is compared with the one etcd's own TLS port gives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tls_http2_that_is_not_grpc_gets_etcds_answer() {
    use http_body_util::BodyExt;
    let p = pki();
    let (opts, secure, _dir) = etcd_with_a_tls_port(&p);
    // watchcache: TLS to its clients, plain text to etcd.
    let env = Env::start_with(opts, |cfg| {
        cfg.tls = Some(ServerTls {
            cert_pem: p.server.0.clone().into_bytes(),
            key_pem: p.server.1.clone().into_bytes(),
            client_ca_pem: Some(p.ca_pem.clone().into_bytes()),
        });
    })
    .await;
    let mut direct = env.direct().await;
    direct.put("/t/1", "x", None).await.expect("put");
    let etcd_tls = format!("127.0.0.1:{secure}");
    let range = r#"{"key":"L3QvMQ=="}"#; // "/t/1"
    for (method, path, body) in [
        ("GET", "/health", ""),
        ("GET", "/version", ""),
        ("POST", "/v3/kv/range", range),
        ("GET", "/no/such/path", ""),
    ] {
        let want = h2_tls(&etcd_tls, &p, method, path, body).await;
        let got = h2_tls(&env.grpc(), &p, method, path, body).await;
        let (ws, wt, wb) = (want.status(), content_type(&want), want.into_body());
        let (gs, gt, gb) = (got.status(), content_type(&got), got.into_body());
        let wb = wb.collect().await.expect("etcd's body").to_bytes();
        let gb = gb.collect().await.expect("watchcache's body").to_bytes();
        assert_eq!((gs, &gt, &gb), (ws, &wt, &wb), "{method} {path}: watchcache's answer, etcd's");
        assert!(ws != 404 || path == "/no/such/path", "{path}: etcd answered 404");
    }
    // The gateway's watch streams its answers as they come, through watchcache too.
    let resp =
        h2_tls(&env.grpc(), &p, "POST", "/v3/watch", r#"{"create_request":{"key":"L3QvMg=="}}"#)
            .await;
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    let mut seen = String::new();
    read_until(&mut body, &mut seen, r#""created":true"#).await;
    direct.put("/t/2", "y", None).await.expect("put");
    read_until(&mut body, &mut seen, r#""key":"L3QvMg==""#).await; // "/t/2"
}

/// Reads `body` into `seen` until `want` is in it (10 s at most).
async fn read_until(body: &mut hyper::body::Incoming, seen: &mut String, want: &str) {
    use http_body_util::BodyExt;
    while !seen.contains(want) {
        let frame = tokio::time::timeout(Duration::from_secs(10), body.frame())
            .await
            .unwrap_or_else(|_| panic!("no {want} in 10 s: {seen}"))
            .expect("the watch's stream ended")
            .expect("the watch's stream");
        if let Ok(data) = frame.into_data() {
            seen.push_str(&String::from_utf8_lossy(&data));
        }
    }
}

fn content_type(r: &::http::Response<hyper::body::Incoming>) -> Option<String> {
    r.headers().get("content-type").and_then(|v| v.to_str().ok()).map(str::to_owned)
}

/// One HTTP/2 request over TLS (ALPN `h2`, the client certificate of `p`), as curl sends it to
/// an https URL; the answer with its body still to read.
async fn h2_tls(
    addr: &str,
    p: &Pki,
    method: &str,
    path: &str,
    body: &str,
) -> ::http::Response<hyper::body::Incoming> {
    let tls = tls_connect(addr, &p.ca_pem, Some(&p.client), &[b"h2", b"http/1.1"])
        .await
        .expect("TLS handshake");
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(b"h2".as_slice()), "{addr}: ALPN");
    let (mut h2, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tls),
    )
    .await
    .expect("HTTP/2");
    tokio::spawn(conn);
    let mut req = ::http::Request::builder().method(method).uri(format!("https://localhost{path}"));
    if !body.is_empty() {
        req = req.header("content-type", "application/json");
    }
    let req =
        req.body(http_body_util::Full::new(bytes::Bytes::from(body.to_owned()))).expect("request");
    tokio::time::timeout(Duration::from_secs(10), h2.send_request(req))
        .await
        .unwrap_or_else(|_| panic!("{method} {path} at {addr}: no answer in 10 s"))
        .expect("an HTTP/2 answer")
}
