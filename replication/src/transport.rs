//! How replication connections are made and who is on the other end (issue 26). A
//! [`Transport`] is either mutual TLS (rustls, TLS 1.3 only: every node is both a server and
//! a client of the same cluster CA) or plain TCP (`insecure`). It connects and accepts, and
//! an accepted connection comes with its [`Peer`]: the address and, under TLS, the
//! certificate the peer proved it holds the key of. [`Peer::may_speak_as`] is the one rule
//! for names: a message naming replica `b` is believed only on a connection whose
//! certificate is valid for `b` (a SAN dNSName, matched by rustls-webpki as a server name
//! is) and only if `b` is a member. The crate never reads a file: the daemon hands over
//! the certificates' bytes ([`TlsIdentity`]).

use std::fmt;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, ServerConfig, SignatureScheme};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::timeout;
use tokio_rustls::{TlsAcceptor, TlsConnector};

/// The default limit on a TLS handshake, on either side.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// This node's credentials: its certificate chain (leaf first), the leaf's private key,
/// and the cluster CA's certificates (the only roots a peer may chain to).
pub struct TlsIdentity {
    pub chain: Vec<CertificateDer<'static>>,
    pub key: PrivateKeyDer<'static>,
    pub ca: Vec<CertificateDer<'static>>,
}

impl TlsIdentity {
    /// Whether this node's own certificate (the chain's leaf) is valid for `name`: a node
    /// whose certificate does not name it would have every request refused by its peers.
    pub fn valid_for(&self, name: &str) -> bool {
        let Some(leaf) = self.chain.first() else {
            return false;
        };
        cert_valid_for(leaf, name).is_ok()
    }
}

/// Why a `Transport` cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error("member name {0:?} is not a DNS name (certificates name members in a SAN dNSName)")]
    BadMember(String),
    #[error("mutual TLS needs at least one member")]
    NoMembers,
    #[error("the CA certificates: {0}")]
    Ca(String),
    #[error("the node certificate or key: {0}")]
    Identity(String),
}

/// How replication connections are made; cheap to clone.
#[derive(Clone)]
pub struct Transport {
    inner: Arc<Inner>,
    handshake_timeout: Duration,
    /// Dials instead of `tokio::net::TcpStream::connect` (a simulated network, plain only).
    dial: Option<Arc<dyn Dial>>,
}

/// A byte stream other than tokio's TCP: a simulated network's socket (`roost-sim` passes
/// turmoil's). Only a plain transport carries one; TLS runs over tokio's TCP alone.
pub trait Io: AsyncRead + AsyncWrite + Send + Unpin + 'static {}

impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> Io for T {}

/// A boxed future, as the network seams below return.
pub type IoFuture<'a, T> = Pin<Box<dyn Future<Output = io::Result<T>> + Send + 'a>>;

/// Connects to `addr` (host:port) over another network than the kernel's
/// ([`Transport::with_dialer`]).
pub trait Dial: Send + Sync + 'static {
    fn dial<'a>(&'a self, addr: &'a str) -> IoFuture<'a, Box<dyn Io>>;
}

/// Accepts connections from another network than the kernel's
/// (`serve_followers_on`). `accept` must be cancel-safe, as `TcpListener::accept` is: the
/// server polls it in a `select!`.
pub trait Listen: Send + 'static {
    fn accept(&mut self) -> IoFuture<'_, (Box<dyn Io>, SocketAddr)>;
}

/// An accepted connection before its handshake.
pub(crate) enum Accepted {
    Tcp(TcpStream),
    Other(Box<dyn Io>),
}

struct Inner {
    tls: Option<Tls>,
    /// Shared with every `Peer` (no copy per connection).
    members: Arc<[String]>,
}

struct Tls {
    acceptor: TlsAcceptor,
    connector: TlsConnector,
    /// The name given to the connector (its verifier accepts any member: `MemberVerifier`).
    any_member: ServerName<'static>,
}

impl fmt::Debug for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Transport")
            .field("tls", &self.is_tls())
            .field("members", &self.inner.members)
            .finish()
    }
}

impl Transport {
    /// Plain TCP: nothing is authenticated; `members`, if not empty, still limits the
    /// replica names a fetch may give (a name check, not a credential).
    pub fn plain(members: Vec<String>) -> Transport {
        Transport::with(None, members)
    }

    /// Mutual TLS with `identity`; a peer must chain to `identity.ca` and be valid for one
    /// of `members`.
    pub fn tls(identity: TlsIdentity, members: Vec<String>) -> Result<Transport, TransportError> {
        if members.is_empty() {
            return Err(TransportError::NoMembers);
        }
        let names = member_names(&members)?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = RootCertStore::empty();
        for c in &identity.ca {
            roots
                .add(c.clone())
                .map_err(|e| TransportError::Ca(e.to_string()))?;
        }
        let roots = Arc::new(roots);
        let server = server_config(&identity, &roots, &provider)?;
        let client = client_config(identity, &roots, &provider, names.clone())?;
        let tls = Tls {
            acceptor: TlsAcceptor::from(Arc::new(server)),
            connector: TlsConnector::from(Arc::new(client)),
            any_member: names[0].clone(),
        };
        Ok(Transport::with(Some(tls), members))
    }

    fn with(tls: Option<Tls>, members: Vec<String>) -> Transport {
        Transport {
            inner: Arc::new(Inner {
                tls,
                members: members.into(),
            }),
            handshake_timeout: HANDSHAKE_TIMEOUT,
            dial: None,
        }
    }

    /// The same plain transport, connecting through `dial` instead of the kernel's TCP (a
    /// simulated network). A TLS transport refuses to connect through a dialer.
    pub fn with_dialer(mut self, dial: Arc<dyn Dial>) -> Transport {
        self.dial = Some(dial);
        self
    }

    /// The same transport with another handshake limit.
    pub fn handshake_timeout(mut self, limit: Duration) -> Transport {
        self.handshake_timeout = limit;
        self
    }

    pub fn is_tls(&self) -> bool {
        self.inner.tls.is_some()
    }

    pub fn members(&self) -> &[String] {
        &self.inner.members
    }

    /// Connects to `addr` (host:port) within `limit`, then (TLS) completes the handshake
    /// within the handshake limit: the peer must be a member.
    pub async fn connect(&self, addr: &str, limit: Duration) -> io::Result<Stream> {
        if let Some(dial) = &self.dial {
            return self.connect_dialed(dial.as_ref(), addr, limit).await;
        }
        let tcp = match timeout(limit, TcpStream::connect(addr)).await {
            Ok(r) => r?,
            Err(_) => return Err(io::Error::new(io::ErrorKind::TimedOut, "connecting")),
        };
        let _ = tcp.set_nodelay(true);
        let Some(tls) = &self.inner.tls else {
            return Ok(Stream::Plain(tcp));
        };
        let hs = tls.connector.connect(tls.any_member.clone(), tcp);
        match timeout(self.handshake_timeout, hs).await {
            Ok(Ok(s)) => Ok(Stream::Tls(Box::new(s.into()))),
            Ok(Err(e)) => Err(io::Error::new(e.kind(), format!("TLS handshake: {e}"))),
            Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, "TLS handshake")),
        }
    }

    /// Completes an accepted connection: (TLS) the handshake within its limit, which only a
    /// client with a certificate from the CA passes. The error is the handshake's.
    pub async fn accept(&self, tcp: TcpStream, addr: SocketAddr) -> io::Result<(Stream, Peer)> {
        let _ = tcp.set_nodelay(true);
        let Some(tls) = &self.inner.tls else {
            let peer = self.peer(addr, None);
            return Ok((Stream::Plain(tcp), peer));
        };
        let s = match timeout(self.handshake_timeout, tls.acceptor.accept(tcp)).await {
            Ok(r) => r?,
            Err(_) => return Err(io::Error::new(io::ErrorKind::TimedOut, "TLS handshake")),
        };
        let leaf = s.get_ref().1.peer_certificates().and_then(|c| c.first());
        let Some(leaf) = leaf.cloned() else {
            let msg = "TLS handshake ended without a client certificate";
            return Err(io::Error::new(io::ErrorKind::PermissionDenied, msg));
        };
        let peer = self.peer(addr, Some(leaf));
        Ok((Stream::Tls(Box::new(s.into())), peer))
    }

    /// [`Transport::connect`] through a dialer: plain only.
    async fn connect_dialed(
        &self,
        dial: &dyn Dial,
        addr: &str,
        limit: Duration,
    ) -> io::Result<Stream> {
        if self.is_tls() {
            let msg = "a dialed connection cannot carry TLS";
            return Err(io::Error::new(io::ErrorKind::Unsupported, msg));
        }
        match timeout(limit, dial.dial(addr)).await {
            Ok(r) => Ok(Stream::Other(r?)),
            Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, "connecting")),
        }
    }

    /// [`Transport::accept`] for a connection from either kind of listener; one from a
    /// [`Listen`] only on a plain transport.
    pub(crate) async fn accept_any(
        &self,
        conn: Accepted,
        addr: SocketAddr,
    ) -> io::Result<(Stream, Peer)> {
        match conn {
            Accepted::Tcp(tcp) => self.accept(tcp, addr).await,
            Accepted::Other(_) if self.is_tls() => {
                let msg = "a connection from another network cannot carry TLS";
                Err(io::Error::new(io::ErrorKind::Unsupported, msg))
            }
            Accepted::Other(io) => Ok((Stream::Other(io), self.peer(addr, None))),
        }
    }

    fn peer(&self, addr: SocketAddr, cert: Option<CertificateDer<'static>>) -> Peer {
        Peer {
            addr,
            cert,
            members: Arc::clone(&self.inner.members),
        }
    }
}

/// The other end of an accepted connection.
#[derive(Clone, Debug)]
pub struct Peer {
    pub addr: SocketAddr,
    /// The leaf certificate the peer proved it holds the key of (TLS only).
    cert: Option<CertificateDer<'static>>,
    members: Arc<[String]>,
}

impl Peer {
    /// Whether this connection was authenticated (mutual TLS).
    pub fn authenticated(&self) -> bool {
        self.cert.is_some()
    }

    /// Whether a message on this connection may name replica `name`: `name` is a member
    /// (any name when no members are configured on a plain transport) and, under TLS, the
    /// peer's certificate is valid for it. `Err` says why not.
    pub fn may_speak_as(&self, name: &str) -> Result<(), String> {
        if !self.members.is_empty() && !self.members.iter().any(|m| m == name) {
            return Err(format!("{name:?} is not a member ({:?})", self.members));
        }
        match &self.cert {
            None => Ok(()),
            Some(cert) => cert_valid_for(cert, name),
        }
    }
}

/// Whether `cert` names `name` (a SAN dNSName, webpki's server-name check).
fn cert_valid_for(cert: &CertificateDer<'_>, name: &str) -> Result<(), String> {
    let server_name =
        ServerName::try_from(name.to_owned()).map_err(|_| format!("{name:?} is not a DNS name"))?;
    let ee = webpki::EndEntityCert::try_from(cert)
        .map_err(|e| format!("the certificate does not parse: {e}"))?;
    ee.verify_is_valid_for_subject_name(&server_name)
        .map_err(|_| format!("the certificate is not valid for {name:?}"))
}

fn member_names(members: &[String]) -> Result<Vec<ServerName<'static>>, TransportError> {
    members
        .iter()
        .map(|m| match ServerName::try_from(m.clone()) {
            Ok(n @ ServerName::DnsName(_)) => Ok(n),
            _ => Err(TransportError::BadMember(m.clone())),
        })
        .collect()
}

fn server_config(
    identity: &TlsIdentity,
    roots: &Arc<RootCertStore>,
    provider: &Arc<CryptoProvider>,
) -> Result<ServerConfig, TransportError> {
    let verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
        .build()
        .map_err(|e| TransportError::Ca(e.to_string()))?;
    let key = identity.key.clone_key();
    let mut config = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| TransportError::Identity(e.to_string()))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(identity.chain.clone(), key)
        .map_err(|e| TransportError::Identity(e.to_string()))?;
    // No resumption: a resumed session would carry the peer's certificate forward without
    // checking it again (one that expired or whose CA was replaced would keep working).
    // Replication connections are long-lived; a full handshake per connection costs little.
    config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
    config.send_tls13_tickets = 0;
    Ok(config)
}

fn client_config(
    identity: TlsIdentity,
    roots: &Arc<RootCertStore>,
    provider: &Arc<CryptoProvider>,
    members: Vec<ServerName<'static>>,
) -> Result<ClientConfig, TransportError> {
    let inner = WebPkiServerVerifier::builder_with_provider(roots.clone(), provider.clone())
        .build()
        .map_err(|e| TransportError::Ca(e.to_string()))?;
    let verifier = Arc::new(MemberVerifier { inner, members });
    let mut config = ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| TransportError::Identity(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_client_auth_cert(identity.chain, identity.key)
        .map_err(|e| TransportError::Identity(e.to_string()))?;
    config.enable_sni = false;
    config.resumption = rustls::client::Resumption::disabled();
    Ok(config)
}

/// A leader is any member: `--follow HOST:PORT` names an address, not a node. The chain,
/// validity and signatures are webpki's checks as for any server; only the name is "one of
/// the members" instead of the host dialled.
#[derive(Debug)]
struct MemberVerifier {
    inner: Arc<WebPkiServerVerifier>,
    members: Vec<ServerName<'static>>,
}

impl ServerCertVerifier for MemberVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _dialled: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let mut last = rustls::Error::General("no members".into());
        for name in &self.members {
            match self
                .inner
                .verify_server_cert(end_entity, intermediates, name, ocsp, now)
            {
                Ok(v) => return Ok(v),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// A replication connection, plain or TLS (or plain over a simulated network).
pub enum Stream {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::TlsStream<TcpStream>>),
    /// Through a [`Dial`] or a [`Listen`]: a simulated network's socket.
    Other(Box<dyn Io>),
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
            Stream::Other(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
            Stream::Other(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
            Stream::Other(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
            Stream::Other(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}
