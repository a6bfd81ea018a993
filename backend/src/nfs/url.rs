//! `nfs://HOST[:PORT][,HOST[:PORT]...]/EXPORT[?nfsport=N&mountport=M&version=V]`, libnfs' URL
//! form, with several hosts for NFSv4.1.
//!
//! `HOST` is a name, an IPv4 address or a bracketed IPv6 address; `PORT` is the portmapper's
//! (default 111); `EXPORT` is the export's path, from its leading `/`. `nfsport` and
//! `mountport` skip the portmapper for that program. `version` is `3` (the default) or `4.1`
//! (spelled so: NFSv4.0 and 4.2 are not spoken). NFSv4.1 uses neither the portmapper nor MOUNT:
//! a host's `PORT` is its NFS port, else `nfsport`, else 2049; `mountport` is an error, and
//! `EXPORT` is the export's path in the server's pseudo filesystem. With 4.1 the hosts may be
//! several, comma-separated: addresses of one server (session trunking), over which the
//! pollers' connections are spread; NFSv3 takes one. Anything else is an error that names what
//! is wrong.

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
    /// The protocol version.
    pub version: NfsVersion,
    /// The server's other addresses (NFSv4.1 only), each a host and its port.
    pub also: Vec<(String, Option<u16>)>,
}

/// The NFS version a URL asks for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum NfsVersion {
    /// NFSv3 (RFC 1813) with MOUNT v3: the default.
    #[default]
    V3,
    /// NFSv4.1 (RFC 8881): sessions, no MOUNT.
    V41,
}

impl NfsUrl {
    /// NFSv4.1's server port of the first host: its own, else `nfsport`, else 2049.
    pub fn nfs4_port(&self) -> u16 {
        self.port.or(self.nfsport).unwrap_or(2049)
    }

    /// NFSv4.1's server addresses: every host with its port (the first host's first).
    pub fn nfs4_hosts(&self) -> Vec<(&str, u16)> {
        let default = self.nfsport.unwrap_or(2049);
        std::iter::once((self.host.as_str(), self.nfs4_port()))
            .chain(self.also.iter().map(|(h, p)| (h.as_str(), p.unwrap_or(default))))
            .collect()
    }
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
    #[error("unknown URL parameter {0:?} (known: nfsport, mountport, version)")]
    UnknownParam(String),
    /// `version=` other than 3 or 4.1.
    #[error("NFS version {0:?} is not supported (3 or 4.1)")]
    Version(String),
    /// Several hosts with NFSv3.
    #[error("several hosts need version=4.1 (NFSv3 takes one)")]
    SeveralHostsV3,
    /// `mountport` with `version=4.1`, which has no MOUNT protocol.
    #[error("mountport with version=4.1: NFSv4.1 has no MOUNT protocol (nfsport names its port)")]
    MountPortV41,
}

fn parse_port(what: &'static str, value: &str) -> Result<u16, UrlError> {
    match value.parse::<u16>() {
        Ok(p) if p != 0 => Ok(p),
        _ => Err(UrlError::BadPort { what, value: value.to_owned() }),
    }
}

/// One `HOST[:PORT]` of the authority.
fn parse_host(authority: &str) -> Result<(String, Option<u16>), UrlError> {
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
    Ok((host.to_owned(), port))
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
        let mut hosts = authority.split(',').map(parse_host);
        let (host, port) = hosts.next().ok_or(UrlError::NoHost)??;
        let also = hosts.collect::<Result<Vec<_>, _>>()?;
        let mut url = NfsUrl {
            host,
            port,
            export: export.to_owned(),
            nfsport: None,
            mountport: None,
            version: NfsVersion::V3,
            also,
        };
        for kv in query.unwrap_or("").split('&').filter(|kv| !kv.is_empty()) {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            match k {
                "nfsport" => url.nfsport = Some(parse_port("nfsport", v)?),
                "mountport" => url.mountport = Some(parse_port("mountport", v)?),
                "version" => {
                    url.version = match v {
                        "3" => NfsVersion::V3,
                        "4.1" => NfsVersion::V41,
                        _ => return Err(UrlError::Version(v.to_owned())),
                    }
                }
                _ => return Err(UrlError::UnknownParam(k.to_owned())),
            }
        }
        if url.version == NfsVersion::V41 && url.mountport.is_some() {
            return Err(UrlError::MountPortV41);
        }
        if url.version == NfsVersion::V3 && !url.also.is_empty() {
            return Err(UrlError::SeveralHostsV3);
        }
        Ok(url)
    }
}

impl std::fmt::Display for NfsUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "nfs://")?;
        let hosts = std::iter::once((&self.host, self.port)).chain(self.also.iter().map(|(h, p)| (h, *p)));
        for (i, (host, port)) in hosts.enumerate() {
            if i > 0 {
                write!(f, ",")?;
            }
            if host.contains(':') {
                write!(f, "[{host}]")?;
            } else {
                write!(f, "{host}")?;
            }
            if let Some(p) = port {
                write!(f, ":{p}")?;
            }
        }
        write!(f, "{}", self.export)?;
        let mut sep = '?';
        for (k, v) in [("nfsport", self.nfsport), ("mountport", self.mountport)] {
            if let Some(v) = v {
                write!(f, "{sep}{k}={v}")?;
                sep = '&';
            }
        }
        if self.version == NfsVersion::V41 {
            write!(f, "{sep}version=4.1")?;
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
                mountport: Some(20491),
                version: NfsVersion::V3,
                also: Vec::new(),
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
        assert_eq!(u.version, NfsVersion::V3, "NFSv3 unless asked");
    }

    #[test]
    fn version_4_1_needs_no_mount_and_defaults_to_port_2049() {
        let u: NfsUrl = "nfs://server/srv/export?version=4.1".parse().unwrap();
        assert_eq!((u.version, u.nfsport, u.mountport), (NfsVersion::V41, None, None));
        assert_eq!(u.nfs4_port(), 2049);
        assert_eq!(u.to_string(), "nfs://server/srv/export?version=4.1");
        let u: NfsUrl = "nfs://127.0.0.1/tmp/e?version=4.1&nfsport=20490".parse().unwrap();
        assert_eq!(u.nfs4_port(), 20490);
        assert_eq!(u.to_string(), "nfs://127.0.0.1/tmp/e?nfsport=20490&version=4.1");
        assert_eq!(u.to_string().parse::<NfsUrl>().unwrap(), u, "the URL round-trips");
        let u: NfsUrl = "nfs://h/x?version=3".parse().unwrap();
        assert_eq!(u.version, NfsVersion::V3);
    }

    #[test]
    fn version_4_1_takes_several_addresses_each_with_its_port() {
        let u: NfsUrl =
            "nfs://10.0.0.1,10.0.0.2:20490,[fd00::3]/srv/e?version=4.1&nfsport=2050".parse().unwrap();
        assert_eq!(u.nfs4_hosts(), [("10.0.0.1", 2050), ("10.0.0.2", 20490), ("fd00::3", 2050)]);
        assert_eq!(u.export, "/srv/e");
        assert_eq!(u.to_string(), "nfs://10.0.0.1,10.0.0.2:20490,[fd00::3]/srv/e?nfsport=2050&version=4.1");
        assert_eq!(u.to_string().parse::<NfsUrl>().unwrap(), u, "the URL round-trips");
        let u: NfsUrl = "nfs://h:3049/e?version=4.1".parse().unwrap();
        assert_eq!(u.nfs4_hosts(), [("h", 3049)], "a host's port is its NFS port with 4.1");
        let e = |s: &str| s.parse::<NfsUrl>().unwrap_err();
        assert_eq!(e("nfs://a,b/x"), UrlError::SeveralHostsV3);
        assert_eq!(e("nfs://a,/x?version=4.1"), UrlError::NoHost);
        assert_eq!(e("nfs://a,b:0/x?version=4.1"), UrlError::BadPort { what: "port", value: "0".into() });
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
        for v in ["4.0", "4.2", "41", "4.1.0", ""] {
            assert_eq!(e(&format!("nfs://h/x?version={v}")), UrlError::Version(v.into()));
        }
        assert!(e("nfs://h/x?version=4.2").to_string().contains("3 or 4.1"));
        assert_eq!(e("nfs://h/x?version=4.1&mountport=20048"), UrlError::MountPortV41);
        assert_eq!(e("nfs://h/x?mountport=20048&version=4.1"), UrlError::MountPortV41);
        assert!(e("nfs://h/x?uid=0").to_string().contains("uid"));
    }
}
