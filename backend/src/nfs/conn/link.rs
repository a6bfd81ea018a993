//! The link: a non-blocking connect, its progress, the move to the server's next address
//! ([`Conn::also_at`]) and the back-off between failed ones (a reconnection starts the receive
//! side over; the calls were put back in the queue when the link dropped).

use std::time::Instant;

use mio::net::TcpStream;

use super::program::Program;
use super::state::{Conn, Link, MAX_BACKOFF, MIN_BACKOFF};

impl<P: Program> Conn<P> {
    pub(super) fn connect(&mut self, now: Instant) {
        self.link = match TcpStream::connect(self.address()) {
            Ok(stream) => Link::Connecting { stream, since: now },
            Err(_) => self.failed_connect(now),
        };
    }

    /// A connect failed: the next address at once, or, once every address failed in a row,
    /// the same after the back-off.
    pub(super) fn failed_connect(&mut self, now: Instant) -> Link {
        self.failed_in_row += 1;
        let addresses = self.others.len() + 1;
        if addresses > 1 {
            self.at = (self.at + 1) % addresses;
            self.stats.address_moves += 1;
            if !self.failed_in_row.is_multiple_of(addresses) {
                return Link::Down { retry_at: now };
            }
        }
        let retry_at = now + self.backoff;
        self.backoff = (self.backoff * 2).min(MAX_BACKOFF).min(self.cfg.retransmit);
        Link::Down { retry_at }
    }

    pub(super) fn progress_link(&mut self, now: Instant) {
        match &self.link {
            Link::Down { retry_at } => {
                if now >= *retry_at {
                    self.connect(now);
                }
            }
            Link::Connecting { stream, since } => {
                let since = *since;
                let state = match stream.take_error() {
                    Ok(Some(_)) | Err(_) => Err(()),
                    Ok(None) => match stream.peer_addr() {
                        Ok(_) => Ok(true),
                        Err(e) if e.kind() == std::io::ErrorKind::NotConnected => Ok(false),
                        Err(_) => Err(()),
                    },
                };
                match state {
                    Ok(true) => {
                        let Link::Connecting { stream, .. } =
                            std::mem::replace(&mut self.link, Link::Down { retry_at: now })
                        else {
                            return;
                        };
                        let _ = stream.set_nodelay(true);
                        self.link = Link::Up { stream };
                        self.backoff = MIN_BACKOFF;
                        self.failed_in_row = 0;
                        if self.connected_once {
                            self.stats.reconnects += 1;
                        }
                        self.connected_once = true;
                        self.rx.clear();
                    }
                    Ok(false) if now.duration_since(since) < self.cfg.retransmit => {}
                    _ => self.link = self.failed_connect(now),
                }
            }
            Link::Up { .. } => {}
        }
    }
}
