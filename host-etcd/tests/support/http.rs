//! A small HTTP/1.1 client for the tests and examples that call watchcache's HTTP API (lists,
//! Kubernetes-style watches, health, metrics): GET only, a status, a body read whole or frame by
//! frame as it streams. It is hyper-util's client, which the server's dependencies already
//! build with these features; a general client such as reqwest would turn on features of the
//! server's own dependencies (tower, hyper-util) and so make cargo build the server a second
//! time for every test and example.
#![allow(dead_code)]

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::de::DeserializeOwned;

/// What a request or a body read can fail with.
pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// A client; connections are kept for reuse unless [`Client::without_pool`] made it.
#[derive(Clone)]
pub struct Client {
    inner: hyper_util::client::legacy::Client<HttpConnector, Empty<Bytes>>,
}

impl Default for Client {
    fn default() -> Self {
        Self::new()
    }
}

impl Client {
    /// A client that keeps idle connections for the next request.
    pub fn new() -> Self {
        Self {
            inner: hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build_http(),
        }
    }

    /// A client that opens a connection per request (a watch that ends closes its connection).
    pub fn without_pool() -> Self {
        Self {
            inner: hyper_util::client::legacy::Client::builder(TokioExecutor::new())
                .pool_max_idle_per_host(0)
                .build_http(),
        }
    }

    /// GET `url` (`http://host:port/path?query`).
    pub async fn get(&self, url: impl AsRef<str>) -> Result<Response, Error> {
        self.send(url.as_ref(), None).await
    }

    /// GET `url` with HTTP basic authentication.
    pub async fn get_basic_auth(
        &self,
        url: impl AsRef<str>,
        user: &str,
        password: &str,
    ) -> Result<Response, Error> {
        use base64::Engine as _;
        let token = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        self.send(url.as_ref(), Some(format!("Basic {token}"))).await
    }

    async fn send(&self, url: &str, authorization: Option<String>) -> Result<Response, Error> {
        let mut req = http::Request::get(url);
        if let Some(a) = authorization {
            req = req.header(http::header::AUTHORIZATION, a);
        }
        let resp = self.inner.request(req.body(Empty::new())?).await?;
        let (parts, body) = resp.into_parts();
        Ok(Response { status: parts.status, body })
    }
}

/// GET `url` with a fresh client.
pub async fn get(url: impl AsRef<str>) -> Result<Response, Error> {
    Client::new().get(url).await
}

/// A response whose body has not been read yet.
pub struct Response {
    status: http::StatusCode,
    body: hyper::body::Incoming,
}

impl Response {
    /// The status code (compares with a number: `r.status() == 404`).
    pub fn status(&self) -> http::StatusCode {
        self.status
    }

    /// The next piece of the body as it arrives; `None` once it has ended.
    pub async fn chunk(&mut self) -> Option<Result<Bytes, Error>> {
        loop {
            match self.body.frame().await? {
                Ok(frame) => {
                    if let Ok(data) = frame.into_data() {
                        return Some(Ok(data));
                    }
                }
                Err(e) => return Some(Err(e.into())),
            }
        }
    }

    /// The whole body.
    pub async fn bytes(self) -> Result<Bytes, Error> {
        Ok(self.body.collect().await?.to_bytes())
    }

    /// The whole body as UTF-8 text.
    pub async fn text(self) -> Result<String, Error> {
        Ok(String::from_utf8(self.bytes().await?.to_vec())?)
    }

    /// The whole body parsed as JSON.
    pub async fn json<T: DeserializeOwned>(self) -> Result<T, Error> {
        Ok(serde_json::from_slice(&self.bytes().await?)?)
    }
}
