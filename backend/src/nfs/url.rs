//! `nfs://HOST[:PORT]/EXPORT[?nfsport=N&mountport=M]`, libnfs' URL form.
//!
//! `HOST` is a name, an IPv4 address or a bracketed IPv6 address; `PORT` is the portmapper's
//! (default 111); `EXPORT` is the export's path, from its leading `/`. `nfsport` and
//! `mountport` skip the portmapper for that program; `version=3` is accepted (it is the only
//! version spoken). Anything else is an error that names what is wrong.

use std::str::FromStr;

/// A parsed `nfs://` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NfsUrl {
    /// Host name or address (IPv6 without the brackets).
    pub host: String,
    /// Portmapper port, if not 111.
    pub port: Option<u16>,
    /// The export's path, starting with `/`.
    pub export: String,
    /// The NFS program's port (no portmapper lookup for it).
    pub nfsport: Option<u16>,
    /// The MOUNT program's port (no portmapper lookup for it).
    pub mountport: Option<u16>,
}

/// What is wrong with an `nfs://` URL.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlError {
    /// It does not start with `nfs://`.
    #[error("not an nfs:// URL")]
    Scheme,
    /// No host before the path.
    #[error("no host in the URL")]
    NoHost,
    /// A bracketed IPv6 address without its closing bracket.
    #[error("unterminated [IPv6] host")]
    BadHost,
    /// A port that is not a number from 1 to 65535.
    #[error("{what}: {value:?} is not a port number (1-65535)")]
    BadPort {
        /// Which port.
        what: &'static str,
        /// What was given.
        value: String,
    },
    /// No export path, or one that is just `/`... is allowed; this is a missing path.
    #[error("no export path after the host")]
    NoExport,
    /// A query key this client does not know.
    #[error("unknown URL parameter {0:?} (known: nfsport, mountport, version=3)")]
    UnknownParam(String),
    /// `version=` other than 3.
    #[error("NFS version {0:?} is not supported (only 3)")]
    Version(String),
}

fn parse_port(what: &'static str, value: &str) -> Result<u16, UrlError> {
    match value.parse::<u16>() {
        Ok(p) if p != 0 => Ok(p),
        _ => Err(UrlError::BadPort { what, value: value.to_owned() }),
    }
}

impl FromStr for NfsUrl {
    type Err = UrlError;

    fn from_str(s: &str) -> Result<NfsUrl, UrlError> {
        let rest = s.strip_prefix("nfs://").ok_or(UrlError::Scheme)?;
        let (rest, query) = match rest.split_once('?') {
            Some((r, q)) => (r, Some(q)),
            None => (rest, None),
        };
        let slash = rest.find('/').ok_or(UrlError::NoExport)?;
        let (authority, export) = rest.split_at(slash);
        let (host, port_str) = if let Some(v6) = authority.strip_prefix('[') {
            let (h, after) = v6.split_once(']').ok_or(UrlError::BadHost)?;
            match after {
                "" => (h, None),
                p => (h, Some(p.strip_prefix(':').ok_or(UrlError::BadHost)?)),
            }
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (authority, None),
            }
        };
        if host.is_empty() {
            return Err(UrlError::NoHost);
        }
        let port = port_str.map(|p| parse_port("port", p)).transpose()?;
        let mut url =
            NfsUrl { host: host.to_owned(), port, export: export.to_owned(), nfsport: None, mountport: None };
        for kv in query.unwrap_or("").split('&').filter(|kv| !kv.is_empty()) {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            match k {
                "nfsport" => url.nfsport = Some(parse_port("nfsport", v)?),
                "mountport" => url.mountport = Some(parse_port("mountport", v)?),
                "version" if v == "3" => {}
                "version" => return Err(UrlError::Version(v.to_owned())),
                _ => return Err(UrlError::UnknownParam(k.to_owned())),
            }
        }
        Ok(url)
    }
}

impl std::fmt::Display for NfsUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.host.contains(':') {
            write!(f, "nfs://[{}]", self.host)?;
        } else {
            write!(f, "nfs://{}", self.host)?;
        }
        if let Some(p) = self.port {
            write!(f, ":{p}")?;
        }
        write!(f, "{}", self.export)?;
        let mut sep = '?';
        for (k, v) in [("nfsport", self.nfsport), ("mountport", self.mountport)] {
            if let Some(v) = v {
                write!(f, "{sep}{k}={v}")?;
                sep = '&';
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepted_forms() {
        let u: NfsUrl = "nfs://127.0.0.1/tmp/g/exp?nfsport=20490&mountport=20491".parse().unwrap();
        assert_eq!(
            u,
            NfsUrl {
                host: "127.0.0.1".into(),
                port: None,
                export: "/tmp/g/exp".into(),
                nfsport: Some(20490),
                mountport: Some(20491)
            }
        );
        assert_eq!(u.to_string(), "nfs://127.0.0.1/tmp/g/exp?nfsport=20490&mountport=20491");
        let u: NfsUrl = "nfs://server:1111/".parse().unwrap();
        assert_eq!((u.host.as_str(), u.port, u.export.as_str()), ("server", Some(1111), "/"));
        let u: NfsUrl = "nfs://[::1]:112/e?version=3".parse().unwrap();
        assert_eq!((u.host.as_str(), u.port, u.export.as_str()), ("::1", Some(112), "/e"));
        assert_eq!(u.to_string(), "nfs://[::1]:112/e");
        let u: NfsUrl = "nfs://[fe80::1]/x".parse().unwrap();
        assert_eq!((u.host.as_str(), u.port), ("fe80::1", None));
    }

    #[test]
    fn errors_name_what_is_wrong() {
        let e = |s: &str| s.parse::<NfsUrl>().unwrap_err();
        assert_eq!(e("http://h/x"), UrlError::Scheme);
        assert_eq!(e("nfs:///x"), UrlError::NoHost);
        assert_eq!(e("nfs://h"), UrlError::NoExport);
        assert_eq!(e("nfs://[::1/x"), UrlError::BadHost);
        assert_eq!(e("nfs://[::1]x/x"), UrlError::BadHost);
        assert_eq!(e("nfs://h:0/x"), UrlError::BadPort { what: "port", value: "0".into() });
        assert_eq!(e("nfs://h:99999/x"), UrlError::BadPort { what: "port", value: "99999".into() });
        assert_eq!(e("nfs://h/x?nfsport=a"), UrlError::BadPort { what: "nfsport", value: "a".into() });
        assert_eq!(e("nfs://h/x?uid=0"), UrlError::UnknownParam("uid".into()));
        assert_eq!(e("nfs://h/x?version=4"), UrlError::Version("4".into()));
        assert!(e("nfs://h/x?uid=0").to_string().contains("uid"));
    }
}
