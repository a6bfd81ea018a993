//! The link: a non-blocking connect, its progress, the move to the server's next address
//! ([`Conn::also_at`]) and the back-off between failed ones (a reconnection starts the receive
//! side over; the calls were put back in the queue when the link dropped), and the way back to
//! the first address once it answers again.

use std::time::Instant;

use mio::net::TcpStream;

use super::program::Program;
use super::state::{Conn, Link, Probe, SlotState, MAX_BACKOFF, MIN_BACKOFF};

/// Whether a non-blocking connect is done (`Ok(true)`), still under way (`Ok(false)`) or failed.
fn connected(stream: &TcpStream) -> Result<bool, ()> {
    match stream.take_error() {
        Ok(Some(_)) | Err(_) => Err(()),
        Ok(None) => match stream.peer_addr() {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotConnected => Ok(false),
            Err(_) => Err(()),
        },
    }
}

impl<P: Program> Conn<P> {
    pub(super) fn connect(&mut self, now: Instant) {
        if let Probe::Ready { .. } = self.probe {
            // The first address answers again: the new link is that connection.
            let Probe::Ready { stream } = std::mem::replace(&mut self.probe, Probe::Idle { at: now }) else {
                return;
            };
            self.at = 0;
            self.stats.address_moves += 1;
            self.link = Link::Connecting { stream, since: now };
            return;
        }
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
                match connected(stream) {
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

    /// Away from the first address: every `probe_every` a connect to it; once up, the link
    /// moves to it as soon as no call is on the wire of the current one (calls queued meanwhile
    /// are held back, [`Conn::holding`]). A probe that fails, or is not done within the
    /// retransmission interval, is tried again later; nothing is lost either way.
    pub(super) fn probe_first(&mut self, now: Instant) {
        if !matches!(self.link, Link::Up { .. }) {
            // Moving or reconnecting: that takes its own course; look again later.
            if let Probe::Connecting { .. } = self.probe {
                self.probe = Probe::Idle { at: now + self.probe_every };
            }
            return;
        }
        match std::mem::replace(&mut self.probe, Probe::Idle { at: now }) {
            Probe::Idle { at } if now < at => self.probe = Probe::Idle { at },
            Probe::Idle { .. } => {
                self.probe = match TcpStream::connect(self.cfg.addr) {
                    Ok(stream) => Probe::Connecting { stream, since: now },
                    Err(_) => Probe::Idle { at: now + self.probe_every },
                };
            }
            Probe::Connecting { stream, since } => {
                self.probe = match connected(&stream) {
                    Ok(true) => Probe::Ready { stream },
                    Ok(false) if now.duration_since(since) < self.cfg.retransmit => {
                        Probe::Connecting { stream, since }
                    }
                    _ => Probe::Idle { at: now + self.probe_every },
                };
            }
            Probe::Ready { stream } => self.probe = Probe::Ready { stream },
        }
        // (The slots are looked at only while a probe is ready: a round trip at most.)
        let ready = matches!(self.probe, Probe::Ready { .. });
        if ready && self.tx.is_none() && !self.slots.iter().any(|s| s.state == SlotState::Sent) {
            let Probe::Ready { stream } =
                std::mem::replace(&mut self.probe, Probe::Idle { at: now + self.probe_every })
            else {
                return;
            };
            // Back on the first address: taken up as a connect that is done (the next round
            // makes it the link, the receive side starts over, the held calls go there).
            self.at = 0;
            self.stats.address_moves += 1;
            self.link = Link::Connecting { stream, since: now };
            self.progress_link(now);
        }
    }

    /// Whether new calls are held back: the first address answers again, and the link moves
    /// there once the calls on the wire are answered.
    pub(super) fn holding(&self) -> bool {
        matches!(self.probe, Probe::Ready { .. })
    }
}
