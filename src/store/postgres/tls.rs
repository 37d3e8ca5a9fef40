//! TLS to PostgreSQL, on rustls, with libpq's `sslmode` meanings:
//!
//! | sslmode | encrypted | the server's certificate |
//! |---|---|---|
//! | `disable` | never | – |
//! | `prefer` (default), `allow` | if the server offers it | not checked (checked against `ca_file`'s CA if one is set) |
//! | `require` | always | as `prefer` |
//! | `verify-ca` | always | signed by `ca_file`'s CA |
//! | `verify-full` | always | as `verify-ca`, and issued for the host connected to |
//!
//! As libpq, verify-ca and verify-full refuse to start without a root certificate:
//! `ca_file` names a PEM file, or `"system"` ([`SYSTEM_ROOTS`], libpq's
//! `sslrootcert=system`) for the public CAs, named on purpose (any certificate a
//! public CA issued to anyone passes verify-ca with them). prefer and require protect
//! against nothing but a passive eavesdropper: the relay says so at start
//! ([`TlsChoice::verified`] is its gauge).
//!
//! `sslmode` and `sslrootcert` may be given in the URL, as libpq takes them; the
//! settings `storage.postgres.sslmode` and `ca_file` win over the URL's. tokio-postgres
//! knows only disable, prefer and require, so the URL's TLS parameters are taken out
//! before it parses the rest ([`split_url`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;

pub(crate) use crate::config::SslMode;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, RootCertStore, SignatureScheme};

use crate::store::StoreError;

impl SslMode {
    fn parse(text: &str) -> Result<Self, StoreError> {
        Ok(match text {
            "disable" => Self::Disable,
            "allow" | "prefer" => Self::Prefer,
            "require" => Self::Require,
            "verify-ca" => Self::VerifyCa,
            "verify-full" => Self::VerifyFull,
            other => {
                return Err(StoreError::Config(format!(
                    "storage.postgres.url: sslmode={other:?} is not one of disable, prefer, \
                     require, verify-ca, verify-full"
                )))
            }
        })
    }

    /// What tokio-postgres is told: whether to ask for TLS and whether to insist.
    fn wire(self) -> tokio_postgres::config::SslMode {
        use tokio_postgres::config::SslMode as Wire;
        match self {
            Self::Disable => Wire::Disable,
            Self::Prefer => Wire::Prefer,
            Self::Require | Self::VerifyCa | Self::VerifyFull => Wire::Require,
        }
    }
}

/// The `ca_file` (or `sslrootcert`) that names the public CAs, as libpq's
/// `sslrootcert=system`.
pub(crate) const SYSTEM_ROOTS: &str = "system";

/// The TLS the relay will use: the settings over the URL's, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TlsChoice {
    pub(crate) mode: SslMode,
    pub(crate) ca_file: Option<PathBuf>,
}

impl TlsChoice {
    /// The settings over the URL's `sslmode` and `sslrootcert`; an error when
    /// verify-ca or verify-full has no root certificate to verify with.
    pub(crate) fn of(url: &str, settings: &TlsSettings) -> Result<Self, StoreError> {
        let (_, in_url) = split_url(url)?;
        let mode = settings.mode.or(in_url.mode).unwrap_or_default();
        let ca_file = settings.ca_file.clone().or(in_url.ca_file);
        if matches!(mode, SslMode::VerifyCa | SslMode::VerifyFull) && ca_file.is_none() {
            let name = if mode == SslMode::VerifyCa { "verify-ca" } else { "verify-full" };
            return Err(StoreError::Config(format!(
                "storage.postgres.sslmode = {name:?} needs a root certificate to verify the \
                 server with: set storage.postgres.ca_file to the PEM file of the CA that \
                 signed the server's certificate, or to \"system\" for the public CAs (as \
                 libpq's sslrootcert=system; then any certificate a public CA issued passes \
                 verify-ca: prefer verify-full)"
            )));
        }
        Ok(Self { mode, ca_file })
    }

    /// Whether the server's certificate is checked against a chosen CA: false means
    /// that an impostor on the path would be talked to (prefer, allow and require
    /// without `ca_file`; prefer also falls back to plaintext without a word).
    pub(crate) fn verified(&self) -> bool {
        match self.mode {
            SslMode::VerifyCa | SslMode::VerifyFull => true,
            SslMode::Require => self.ca_file.is_some(),
            SslMode::Disable | SslMode::Prefer => false,
        }
    }
}

/// How to connect: the URL's TLS parameters, once taken out of it.
#[derive(Clone, Debug, Default)]
pub(crate) struct TlsSettings {
    pub(crate) mode: Option<SslMode>,
    pub(crate) ca_file: Option<PathBuf>,
}

/// `url` without the TLS parameters tokio-postgres cannot parse (`sslmode`,
/// `sslrootcert`), and those parameters. Both URL (`postgres://...?sslmode=...`) and
/// key=value (`host=... sslmode=...`) forms.
pub(crate) fn split_url(url: &str) -> Result<(String, TlsSettings), StoreError> {
    let mut tls = TlsSettings::default();
    let mut take = |key: &str, value: &str| -> Result<bool, StoreError> {
        match key {
            "sslmode" => tls.mode = Some(SslMode::parse(value)?),
            "sslrootcert" => tls.ca_file = Some(PathBuf::from(value)),
            _ => return Ok(false),
        }
        Ok(true)
    };
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let Some((base, query)) = url.split_once('?') else {
            return Ok((url.to_owned(), tls));
        };
        let mut kept = Vec::new();
        for pair in query.split('&') {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let value = percent_decode(value);
            if !take(key, &value)? {
                kept.push(pair);
            }
        }
        let rest =
            if kept.is_empty() { base.to_owned() } else { format!("{base}?{}", kept.join("&")) };
        return Ok((rest, tls));
    }
    let mut kept = Vec::new();
    for token in url.split_whitespace() {
        let (key, value) = token.split_once('=').unwrap_or((token, ""));
        if !take(key.trim(), value.trim_matches('\''))? {
            kept.push(token);
        }
    }
    Ok((kept.join(" "), tls))
}

/// `%XX` sequences decoded (a CA path in a URL query may carry them).
fn percent_decode(text: &str) -> String {
    let hex = |b: u8| (b as char).to_digit(16).and_then(|d| u8::try_from(d).ok());
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let (Some(hi), Some(lo)) = (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                out.push(hi * 16 + lo);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The connector for `mode` and `ca_file`, and `config` told whether to use TLS.
pub(crate) fn connector(
    config: &mut tokio_postgres::Config,
    mode: SslMode,
    ca_file: Option<&Path>,
) -> Result<tokio_postgres_rustls::MakeRustlsConnect, StoreError> {
    config.ssl_mode(mode.wire());
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let roots = Arc::new(roots(ca_file)?);
    let webpki = WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
        .build()
        .map_err(|e| StoreError::Config(format!("storage.postgres.ca_file: {e}")))?;
    let check = match (mode, ca_file) {
        (SslMode::VerifyFull, _) => Check::Full,
        (SslMode::VerifyCa, _) | (SslMode::Prefer | SslMode::Require, Some(_)) => Check::Ca,
        (SslMode::Disable, _) | (SslMode::Prefer | SslMode::Require, None) => Check::None,
    };
    let verifier = Arc::new(Verifier { webpki, check, provider: provider.clone() });
    let client = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| StoreError::Config(format!("TLS for PostgreSQL: {e}")))?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    Ok(tokio_postgres_rustls::MakeRustlsConnect::new(client))
}

/// The CAs a server's certificate may be signed by: `ca_file`'s, or the public ones
/// (`"system"`; and for prefer and require without a `ca_file`, which check nothing).
fn roots(ca_file: Option<&Path>) -> Result<RootCertStore, StoreError> {
    let mut roots = RootCertStore::empty();
    let path = match ca_file {
        Some(path) if path != Path::new(SYSTEM_ROOTS) => path,
        _ => {
            roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
            return Ok(roots);
        }
    };
    use rustls::pki_types::pem::PemObject;
    let shown = path.display();
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| {
            StoreError::Config(format!("storage.postgres.ca_file {shown}: cannot read it: {e}"))
        })?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| StoreError::Config(format!("storage.postgres.ca_file {shown}: {e}")))?;
    if certs.is_empty() {
        return Err(StoreError::Config(format!(
            "storage.postgres.ca_file {shown}: no PEM certificate in it"
        )));
    }
    for cert in certs {
        roots
            .add(cert)
            .map_err(|e| StoreError::Config(format!("storage.postgres.ca_file {shown}: {e}")))?;
    }
    Ok(roots)
}

/// How much of the server's certificate is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Check {
    /// Nothing (encryption against passive eavesdropping only: libpq's `require`).
    None,
    /// Signed by a trusted CA, for any name.
    Ca,
    /// Signed by a trusted CA, for the host connected to.
    Full,
}

#[derive(Debug)]
struct Verifier {
    webpki: Arc<WebPkiServerVerifier>,
    check: Check,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl ServerCertVerifier for Verifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        use rustls::{CertificateError, Error};
        if self.check == Check::None {
            return Ok(ServerCertVerified::assertion());
        }
        match self.webpki.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        ) {
            Err(Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) if self.check == Check::Ca => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verifying_needs_a_root_certificate_named_and_only_a_chosen_ca_counts_as_verified() {
        let settings =
            |mode, ca: Option<&str>| TlsSettings { mode, ca_file: ca.map(PathBuf::from) };
        for url in ["postgres://u@db/app?sslmode=verify-ca", "host=db sslmode=verify-full"] {
            let e = TlsChoice::of(url, &TlsSettings::default()).unwrap_err().to_string();
            assert!(e.contains("needs a root certificate") && e.contains("\"system\""), "{e}");
        }
        let url = "postgres://u:secret@db/app";
        let e = TlsChoice::of(url, &settings(Some(SslMode::VerifyCa), None)).unwrap_err();
        assert!(!e.to_string().contains("secret"), "never the URL");
        let system = TlsChoice::of(url, &settings(Some(SslMode::VerifyFull), Some("system")));
        assert!(system.unwrap().verified());
        let in_url = TlsChoice::of(
            "postgres://db/app?sslmode=verify-ca&sslrootcert=system",
            &TlsSettings::default(),
        );
        assert!(in_url.unwrap().verified());
        assert!(
            !TlsChoice::of(url, &TlsSettings::default()).unwrap().verified(),
            "prefer, the default"
        );
        assert!(!TlsChoice::of(url, &settings(Some(SslMode::Require), None)).unwrap().verified());
        assert!(TlsChoice::of(url, &settings(Some(SslMode::Require), Some("/ca.pem")))
            .unwrap()
            .verified());
        assert!(roots(Some(Path::new(SYSTEM_ROOTS))).unwrap().len() > 50, "the public CAs");
    }

    #[test]
    fn tls_parameters_are_taken_out_of_both_url_forms() {
        let (rest, tls) =
            split_url("postgres://u:p@db:5432/app?sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem&application_name=x")
                .unwrap();
        assert_eq!(rest, "postgres://u:p@db:5432/app?application_name=x");
        assert_eq!(tls.mode, Some(SslMode::VerifyFull));
        assert_eq!(tls.ca_file, Some(PathBuf::from("/etc/ca.pem")));
        let (rest, tls) = split_url("postgres://u@db/app?sslmode=require").unwrap();
        assert_eq!((rest.as_str(), tls.mode), ("postgres://u@db/app", Some(SslMode::Require)));
        let (rest, tls) =
            split_url("host=db user=u sslmode=verify-ca sslrootcert=/ca.pem").unwrap();
        assert_eq!(rest, "host=db user=u");
        assert_eq!(tls.mode, Some(SslMode::VerifyCa));
        assert_eq!(tls.ca_file, Some(PathBuf::from("/ca.pem")));
        let (rest, tls) = split_url("postgres://u@db/app").unwrap();
        assert_eq!((rest.as_str(), tls.mode), ("postgres://u@db/app", None));
        let e = split_url("postgres://u@db/app?sslmode=sometimes").unwrap_err().to_string();
        assert!(e.contains("\"sometimes\"") && e.contains("verify-full"), "{e}");
        assert!(!e.contains("u@db"), "the URL in an error: {e}");
        assert_eq!(percent_decode("%2Fa%zz%é%4"), "/a%zz%é%4");
    }
}
