//! The control socket's event loop: one thread, a `mio` poll over the listener, the clients and
//! a waker (a finished job, or the order to stop).
//!
//! Nothing a client does holds the loop up:
//! - responses are written without blocking; what the socket does not take waits in the
//!   client's output, and while more than [`OUTPUT_HIGH`] bytes wait, its next requests are not
//!   read (a client that never reads gets no further than that);
//! - a client that sends nothing and has nothing waiting for [`IDLE_TIMEOUT`] is dropped, and
//!   so is one that reads none of its waiting output for as long; with [`MAX_CONNECTIONS`]
//!   connected, a new client takes the place of the one idle longest (if idle at least
//!   [`EVICTABLE_AFTER`]), or is told to try again;
//! - work that may take long (creating a function, which may mount an NFS export; removing one,
//!   which waits for its client) runs on a thread of its own, at most [`MAX_JOBS`] at once, and
//!   its response goes out through the loop when it is done.

use std::collections::HashMap;
use std::io::{self, ErrorKind, Read, Write};
use std::os::unix::net::UnixListener as StdListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use log::{debug, warn};
use mio::net::{UnixListener, UnixStream};
use mio::{Events, Interest, Poll, Token, Waker};
use serde_json::{json, Value};

use super::access::check_peer;
use super::{LineAnswer, Methods, RpcError, IDLE_TIMEOUT, MAX_CONNECTIONS, MAX_JOBS, MAX_LINE};

const LISTENER: Token = Token(0);
const WAKER: Token = Token(1);

/// While more response bytes than this wait for a client to read them, its next requests are
/// not read.
pub const OUTPUT_HIGH: usize = 64 * 1024;
/// How often the loop looks for idle clients while any are connected.
const TICK: Duration = Duration::from_secs(1);
/// A client idle at least this long may be dropped to make room for a new one.
pub const EVICTABLE_AFTER: Duration = Duration::from_secs(1);

/// Starts the loop on a thread of its own: its waker, its stop flag and its thread.
pub(super) fn spawn(
    listener: StdListener,
    methods: Methods,
    uid: u32,
    group: Option<u32>,
) -> io::Result<(Arc<Waker>, Arc<AtomicBool>, JoinHandle<()>)> {
    let poll = Poll::new()?;
    let waker = Arc::new(Waker::new(poll.registry(), WAKER)?);
    let mut listener = UnixListener::from_std(listener);
    poll.registry().register(&mut listener, LISTENER, Interest::READABLE)?;
    let stop = Arc::new(AtomicBool::new(false));
    let (tx, done) = mpsc::channel();
    let later = Later { tx, waker: waker.clone(), lines: HashMap::new(), next: 0, running: 0 };
    let lp = Loop {
        poll,
        listener,
        methods,
        stop: stop.clone(),
        done,
        later,
        uid,
        group,
        clients: HashMap::new(),
        next: 2,
    };
    let join = std::thread::Builder::new().name("control-socket".into()).spawn(move || lp.run())?;
    Ok((waker, stop, join))
}

/// One connected client.
struct Client {
    stream: UnixStream,
    /// Bytes read that are not a whole line yet (or lines held back while output waits).
    input: Vec<u8>,
    /// Response bytes the socket has not taken yet.
    output: Vec<u8>,
    /// Its lines whose response waits for jobs.
    waiting: usize,
    /// When it last sent a byte or took one of its responses' bytes.
    active: Instant,
    /// It hung up its sending side: served until its responses are out.
    eof: bool,
    /// Registered for writability too.
    writable: bool,
}

impl Client {
    fn new(stream: UnixStream) -> Self {
        Client {
            stream,
            input: Vec::new(),
            output: Vec::new(),
            waiting: 0,
            active: Instant::now(),
            eof: false,
            writable: false,
        }
    }

    /// How long it has been idle: `None` while it waits for a job's response (that wait is the
    /// daemon's, not the client's).
    fn idle(&self, now: Instant) -> Option<Duration> {
        (self.waiting == 0).then(|| now.saturating_duration_since(self.active))
    }

    fn queue(&mut self, line: &str) {
        self.output.extend_from_slice(line.as_bytes());
        self.output.push(b'\n');
    }

    /// Writes what waits, as far as the socket takes it; false if the client is gone.
    fn flush(&mut self) -> bool {
        while !self.output.is_empty() {
            match self.stream.write(&self.output) {
                Ok(0) => return false,
                Ok(n) => {
                    self.output.drain(..n);
                    self.active = Instant::now();
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return true,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return false,
            }
        }
        true
    }

    /// Writes what waits, answers the whole lines read (starting the jobs of those that answer
    /// later) and reads more, until the socket has nothing more to read or too much output
    /// waits; false once the client is to be dropped.
    fn serve(&mut self, token: Token, methods: &mut Methods, later: &mut Later) -> bool {
        loop {
            if !self.flush() {
                return false;
            }
            if self.output.len() > OUTPUT_HIGH {
                return true; // the rest once it reads (writability)
            }
            if let Some(end) = self.input.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.input.drain(..=end).collect();
                let answer = methods.line(&line[..end]);
                if !answer.jobs.is_empty() {
                    self.waiting += 1;
                    later.start(token, answer);
                } else if let Some(text) = answer.text() {
                    self.queue(&text);
                }
                continue;
            }
            if self.input.len() > MAX_LINE {
                let e = RpcError::InvalidRequest(format!("request longer than {MAX_LINE} bytes"));
                self.queue(&e.to_json(Value::Null).to_string());
                let _ = self.flush();
                return false;
            }
            if self.eof {
                return self.waiting > 0 || !self.output.is_empty();
            }
            let mut chunk = [0u8; 4096];
            match self.stream.read(&mut chunk) {
                Ok(0) => self.eof = true,
                Ok(n) => {
                    self.input.extend_from_slice(&chunk[..n]);
                    self.active = Instant::now();
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return true,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return false,
            }
        }
    }
}

/// A finished job: the response for one slot of a waiting line.
struct Done {
    line: u64,
    slot: usize,
    response: Option<Value>,
}

/// A response line waiting for its jobs.
struct Waiting {
    client: Token,
    answer: LineAnswer,
    left: usize,
}

/// The jobs of requests that answer later and the lines waiting for them.
struct Later {
    tx: mpsc::Sender<Done>,
    waker: Arc<Waker>,
    lines: HashMap<u64, Waiting>,
    next: u64,
    /// Jobs running.
    running: usize,
}

impl Later {
    /// Starts the jobs of `answer` (each on a thread of its own, at most [`MAX_JOBS`] at once:
    /// past that a job's request is answered that the daemon is busy) and keeps the line until
    /// they are done.
    fn start(&mut self, client: Token, mut answer: LineAnswer) {
        let line = self.next;
        self.next += 1;
        let jobs = std::mem::take(&mut answer.jobs);
        let mut left = 0;
        for (slot, id, job) in jobs {
            if self.running >= MAX_JOBS {
                let e = RpcError::Server(format!("{MAX_JOBS} requests are being worked on; try again"));
                answer.slots[slot] = id.map(|id| e.to_json(id));
                continue;
            }
            let (tx, waker) = (self.tx.clone(), self.waker.clone());
            let id2 = id.clone();
            let started = std::thread::Builder::new().name("control-job".into()).spawn(move || {
                let result = job();
                let response = id.map(|id| match result {
                    Ok(v) => json!({"jsonrpc": "2.0", "result": v, "id": id}),
                    Err(e) => e.to_json(id),
                });
                let _ = tx.send(Done { line, slot, response });
                let _ = waker.wake();
            });
            match started {
                Ok(_) => {
                    left += 1;
                    self.running += 1;
                }
                Err(e) => {
                    let e = RpcError::Server(format!("cannot start the request's thread: {e}"));
                    answer.slots[slot] = id2.map(|id| e.to_json(id));
                }
            }
        }
        self.lines.insert(line, Waiting { client, answer, left });
        if left == 0 {
            let _ = self.tx.send(Done { line, slot: usize::MAX, response: None });
            let _ = self.waker.wake();
        }
    }

    /// Fills a finished job's slot; returns the line's client and text once the line is whole.
    fn finish(&mut self, done: Done) -> Option<(Token, Option<String>)> {
        if done.slot != usize::MAX {
            self.running = self.running.saturating_sub(1);
        }
        let w = self.lines.get_mut(&done.line)?;
        if let Some(slot) = w.answer.slots.get_mut(done.slot) {
            *slot = done.response;
            w.left -= 1;
        }
        if w.left > 0 {
            return None;
        }
        let w = self.lines.remove(&done.line)?;
        Some((w.client, w.answer.text()))
    }
}

/// The loop and everything it serves.
struct Loop {
    poll: Poll,
    listener: UnixListener,
    methods: Methods,
    stop: Arc<AtomicBool>,
    done: mpsc::Receiver<Done>,
    later: Later,
    /// The daemon's uid, which may use the socket.
    uid: u32,
    /// The control group, whose members may use it.
    group: Option<u32>,
    clients: HashMap<Token, Client>,
    next: usize,
}

impl Loop {
    fn run(mut self) {
        let mut events = Events::with_capacity(64);
        loop {
            let timeout = (!self.clients.is_empty()).then_some(TICK);
            if let Err(e) = self.poll.poll(&mut events, timeout) {
                if e.kind() == ErrorKind::Interrupted {
                    continue;
                }
                warn!("control socket: event loop failed: {e}");
                return;
            }
            for ev in events.iter() {
                match ev.token() {
                    WAKER => {
                        if self.stop.load(Ordering::SeqCst) {
                            return;
                        }
                        self.finished_jobs();
                        self.accept();
                    }
                    LISTENER => self.accept(),
                    token => self.serve(token),
                }
            }
            self.drop_stale(Instant::now());
        }
    }

    /// Sends the responses whose jobs are done.
    fn finished_jobs(&mut self) {
        while let Ok(done) = self.done.try_recv() {
            let Some((token, text)) = self.later.finish(done) else { continue };
            let Some(c) = self.clients.get_mut(&token) else { continue };
            c.waiting = c.waiting.saturating_sub(1);
            if let Some(text) = text {
                c.queue(&text);
            }
            self.serve(token);
        }
    }

    fn accept(&mut self) {
        if self.methods.state.updater.as_ref().is_some_and(|u| u.handed_over()) {
            // A live update's new process serves the socket now: what waits is its to accept.
            let _ = self.poll.registry().deregister(&mut self.listener);
            return;
        }
        loop {
            match self.listener.accept() {
                Ok((mut stream, _)) => {
                    if let Err(why) = check_peer(&stream, self.uid, self.group) {
                        warn!("control socket: refusing a client: {why}");
                        refuse(&mut stream, RpcError::PermissionDenied(why));
                        continue;
                    }
                    if self.clients.len() >= MAX_CONNECTIONS && !self.evict_idlest() {
                        warn!("control socket: {MAX_CONNECTIONS} clients busy; refusing another");
                        let why = format!("{MAX_CONNECTIONS} clients are being served; try again");
                        refuse(&mut stream, RpcError::Server(why));
                        continue;
                    }
                    let token = Token(self.next);
                    self.next += 1;
                    if let Err(e) = self.poll.registry().register(&mut stream, token, Interest::READABLE) {
                        warn!("control socket: cannot serve a client: {e}");
                        continue;
                    }
                    self.clients.insert(token, Client::new(stream));
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => {
                    warn!("control socket: accept: {e}");
                    break;
                }
            }
        }
    }

    /// Drops the client idle longest, if one has been idle for [`EVICTABLE_AFTER`]; whether one
    /// was.
    fn evict_idlest(&mut self) -> bool {
        let now = Instant::now();
        let idlest = self
            .clients
            .iter()
            .filter_map(|(&t, c)| c.idle(now).filter(|&d| d >= EVICTABLE_AFTER).map(|d| (d, t)))
            .max();
        let Some((idle, token)) = idlest else { return false };
        warn!("control socket: {MAX_CONNECTIONS} clients; dropping the one idle for {idle:?} to make room");
        self.drop_client(token);
        true
    }

    /// Drops the clients idle for [`IDLE_TIMEOUT`].
    fn drop_stale(&mut self, now: Instant) {
        let stale: Vec<Token> = (self.clients.iter())
            .filter(|(_, c)| c.idle(now).is_some_and(|d| d >= IDLE_TIMEOUT))
            .map(|(&t, _)| t)
            .collect();
        for t in stale {
            debug!("control socket: dropping a client idle for {IDLE_TIMEOUT:?}");
            self.drop_client(t);
        }
    }

    fn serve(&mut self, token: Token) {
        let Some(c) = self.clients.get_mut(&token) else { return };
        if !c.serve(token, &mut self.methods, &mut self.later) {
            self.drop_client(token);
            return;
        }
        // Writability is asked for only while output waits.
        let want = !c.output.is_empty();
        if want != c.writable {
            let interest = if want { Interest::READABLE | Interest::WRITABLE } else { Interest::READABLE };
            if self.poll.registry().reregister(&mut c.stream, token, interest).is_err() {
                self.drop_client(token);
                return;
            }
            c.writable = want;
        }
    }

    fn drop_client(&mut self, token: Token) {
        if let Some(mut c) = self.clients.remove(&token) {
            let _ = self.poll.registry().deregister(&mut c.stream);
        }
    }
}

/// Tells a refused client why, in one write that does not wait (a new connection's buffer takes
/// a line of this size).
fn refuse(stream: &mut UnixStream, e: RpcError) {
    let mut line = e.to_json(Value::Null).to_string();
    line.push('\n');
    let _ = stream.write(line.as_bytes());
}
