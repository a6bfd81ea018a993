//! The data plane: poller threads that own virtqueues and serve them by polling.
//!
//! Each poller owns a disjoint set of queues by value (`&mut`, no lock) and runs rounds: take the
//! requests the driver made available, hand each validated chain to the [`RequestHandler`], push
//! the used entries, publish the used index once per queue per round, then decide interrupts per
//! EVENT_IDX/NO_INTERRUPT and write each needed MSI-X eventfd once. While it polls, the rings are
//! all it reads: driver notifications are suppressed. With `polling = "busy"` a poller never
//! sleeps (a dedicated DPU core); with `"adaptive"`, after `idle_spin_us` without work it backs off
//! to sleeps of at most `idle_sleep_us` so that many devices can share few cores. With
//! `doorbells = "socket"` it turns notifications on before it parks, and a doorbell (a
//! REGION_WRITE to the notify area) wakes it: directly, as a sleeping poller also waits on the
//! client's socket ([`PollerSet::set_doorbell_source`]), or through the control plane's
//! [`PollerSet::kick`] once that thread has read the message; with `"shared"` the notify page is plain shared memory nobody reads and a parked poller
//! wakes at the end of its sleep. Any control message wakes it at once.
//!
//! Statistics: each poller writes its own block of [`crate::stats::DeviceCounters`] (see there).
//!
//! A handler may give each poller an [`Engine`] (an io_uring, say): requests it cannot finish at
//! once stay pending and are completed, out of order, from the same poller's later rounds.
//! Requests that wait on an outside event (one another request ends) are kept apart: see
//! [`Outcome::Wait`].
//!
//! The poller threads are a [`PollerPool`], which several functions (devices) of one daemon may
//! share: each function attaches a [`PollerSet`] to it, and each poller keeps that function's
//! queues, memory snapshot, eventfds, engine and waiting requests apart from the others'. A
//! function's messages touch only its own part of a poller; one that must wait for the
//! function's engine to drain is held while the poller goes on serving the other functions.
//!
//! The control plane talks to pollers only by messages ([`PollerSet`]): start/stop queues, a new
//! guest-memory snapshot, new interrupt eventfds. Every message is acknowledged after the poller
//! applied it *between* two requests, so once all pollers acknowledged a new memory snapshot no
//! request can still be using the old one: that is when DMA_UNMAP may be answered.
//!
//! Files: `engine.rs` (what requests are handed to), `pool.rs` (the pool and a function's
//! handle on it), `msg.rs` (the messages between them), `serve.rs` (a poller thread's rounds and
//! sleeps), `attached.rs` (a function's part of a poller), `queue.rs` (serving its queues),
//! `parked.rs` (requests that wait) and `wait.rs` (blocking instead of polling).

mod attached;
mod engine;
mod msg;
mod parked;
mod pool;
mod queue;
mod serve;
mod wait;

pub use crate::interrupt::Irqs;
pub use engine::{Engine, Outcome, RequestHandler, Taken, MAX_WAIT_REPLY};
pub use parked::{ParkedState, QueueState};
pub use pool::{FreezeError, FunctionShared, PollerPool, PollerSet};
pub use wait::Readiness;

#[cfg(test)]
mod tests;
