//! Hardware profiles (`hw-configs/*.toml`): what the device offers and how its pollers run.
//!
//! A profile is a flat TOML table. Unknown keys are rejected (serde names the key), and every
//! value is checked by [`Profile::validate`], whose errors name the offending key, so a typo in a
//! profile never silently falls back to a default.

use std::path::Path;

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Largest split-ring size the device accepts (the virtio limit is 32768; 1024 is what Linux and the
/// peers use, and the notify window is sized for it).
pub const MAX_QUEUE_SIZE: u16 = 32768;
/// Largest number of request queues (the notify window holds one 4-byte doorbell per queue).
pub const MAX_REQUEST_QUEUES: u16 = 1023;
/// Longest tag the device config can carry (`tag[36]`).
pub const MAX_TAG_LEN: usize = 36;
/// Longest `remove_timeout_ms` accepted (ten minutes).
pub const MAX_REMOVE_TIMEOUT_MS: u64 = 600_000;

/// Errors reading or validating a profile.
#[derive(Debug, Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read profile {path}")]
    Read {
        /// Path of the profile.
        path: String,
        /// Underlying I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The TOML is malformed, has an unknown key or a value of the wrong type.
    #[error("invalid profile: {0}")]
    Parse(#[from] toml::de::Error),
    /// A key has a value the device cannot honour.
    #[error("invalid value for `{key}`: {reason}")]
    Invalid {
        /// The offending key.
        key: &'static str,
        /// Why it is rejected.
        reason: String,
    },
}

/// How pollers behave when their queues are idle.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum Polling {
    /// Never sleep: lowest latency, one core per poller.
    Busy,
    /// Spin for `idle_spin_us`, then sleep up to `idle_sleep_us` at a time.
    #[default]
    Adaptive,
}

/// Where guest doorbells (writes to the notify area) go.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum Doorbells {
    /// `shared` for busy polling, `socket` for adaptive polling.
    #[default]
    Auto,
    /// The notify area is shared memory (a sparse mmap area): doorbells never leave it, and a
    /// parked poller wakes only on its timer. For pollers that never park.
    Shared,
    /// The notify area is trapped: a doorbell reaches the device as a REGION_WRITE on the socket
    /// and wakes the poller of that queue. Pollers ask for doorbells only while parked (they
    /// suppress them while polling), so a busy device sees none.
    Socket,
}

/// Which poller serves which queue.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq, Default)]
#[serde(rename_all = "kebab-case")]
pub enum QueueMapping {
    /// Every queue, hiprio included, round robin: queue *i* goes to poller *i mod P*. With one
    /// poller per queue (P = N + 1) each poller owns exactly one queue.
    #[default]
    Spread,
    /// Request queue *k* (1..=N) goes to poller *(k - 1) mod P* and the hiprio queue, which
    /// carries only FORGET and INTERRUPT, rides along on poller 0. With P = N each request queue
    /// has a core of its own and no core is spent on hiprio.
    RequestQueues,
}

/// A hardware profile: the device's shape and its poller placement.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct Profile {
    /// Free-form description of the hardware this profile is for.
    pub description: String,
    /// Mount tag shown in the device config (`mount -t virtiofs TAG`), 1..=36 bytes of UTF-8.
    pub tag: String,
    /// Number of request queues (queue 0 is always the hiprio queue).
    pub request_queues: u16,
    /// Maximum size of each virtqueue (a power of two); the driver may choose a smaller one.
    pub queue_size: u16,
    /// CPU cores the pollers are pinned to; one poller per entry. Empty: one unpinned poller.
    pub poller_cores: Vec<usize>,
    /// Offer packed virtqueues (VIRTIO_F_RING_PACKED) besides split ones; the driver chooses.
    pub packed_ring: bool,
    /// `busy`: pollers never sleep (a dedicated core, as on a DPU); `adaptive`: after
    /// `idle_spin_us` without work they back off to sleeps of at most `idle_sleep_us` (shared cores).
    pub polling: Polling,
    /// How long a poller keeps busy-polling after its queues went idle before it backs off, in
    /// microseconds (adaptive polling).
    pub idle_spin_us: u64,
    /// Longest sleep of an idle poller, in microseconds. With doorbells on the socket a doorbell
    /// ends the sleep earlier, so this only bounds how late a poller notices a request whose
    /// driver did not ring.
    pub idle_sleep_us: u64,
    /// Where guest doorbells go (`auto`, `shared` or `socket`); see [`Doorbells`].
    pub doorbells: Doorbells,
    /// Which poller serves which queue (`spread` or `request-queues`); see [`QueueMapping`].
    pub queue_mapping: QueueMapping,
    /// Measure each request's device-side latency into the per-class histograms (two reads of
    /// the CPU's cycle counter per batch of requests a queue gives a poll round); `false` keeps
    /// only the counters.
    pub latency_histograms: bool,
    /// Keep each queue's in-flight record in shared memory (crash recovery: which chains were
    /// taken and not returned; four stores per request, no system call; a packed ring's also
    /// copies each chain's descriptors).
    pub inflight_tracking: bool,
    /// Most DMA windows a client may have mapped at once (1 to 65535); past it DMA_MAP fails
    /// ENOSPC. Each window with a descriptor keeps that descriptor open.
    pub max_dma_windows: usize,
    /// Most bytes, in MiB, the DMA windows with a descriptor may map together; past it DMA_MAP
    /// fails ENOSPC.
    pub max_dma_mib: u64,
    /// Descriptors kept free for accepting the next client and for serving: a DMA window whose
    /// descriptor would leave fewer free below RLIMIT_NOFILE fails EMFILE.
    pub fd_reserve: u64,
    /// How long, in milliseconds, a client asked to let the device go (a function removed at
    /// run time: the device-request interrupt, which QEMU turns into a hot-unplug request to
    /// the guest) may keep it before it is disconnected; 0 disconnects at once.
    pub remove_timeout_ms: u64,
}

impl Default for Profile {
    fn default() -> Self {
        Profile {
            description: String::new(),
            tag: "virtiofs".to_string(),
            request_queues: 1,
            queue_size: 128,
            poller_cores: Vec::new(),
            packed_ring: true,
            polling: Polling::Adaptive,
            idle_spin_us: 50,
            idle_sleep_us: 200,
            doorbells: Doorbells::Auto,
            queue_mapping: QueueMapping::Spread,
            latency_histograms: true,
            inflight_tracking: false,
            max_dma_windows: 4096,
            max_dma_mib: 1 << 20,
            fd_reserve: 128,
            remove_timeout_ms: 5000,
        }
    }
}

impl Profile {
    /// Reads and validates a profile file.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| ConfigError::Read { path: path.display().to_string(), source })?;
        Self::from_toml(&text)
    }

    /// Parses and validates a profile from TOML text.
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        let profile: Profile = toml::from_str(text)?;
        profile.validate()?;
        Ok(profile)
    }

    /// Checks every value; the error names the first offending key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |key, reason: String| Err(ConfigError::Invalid { key, reason });
        if self.tag.is_empty() || self.tag.len() > MAX_TAG_LEN {
            return invalid(
                "tag",
                format!("must be 1 to {MAX_TAG_LEN} bytes of UTF-8, got {} bytes", self.tag.len()),
            );
        }
        if self.tag.contains('\0') {
            return invalid("tag", "must not contain NUL".into());
        }
        if self.request_queues == 0 || self.request_queues > MAX_REQUEST_QUEUES {
            return invalid(
                "request_queues",
                format!("must be 1 to {MAX_REQUEST_QUEUES}, got {}", self.request_queues),
            );
        }
        if !self.queue_size.is_power_of_two() || self.queue_size < 2 || self.queue_size > MAX_QUEUE_SIZE {
            return invalid(
                "queue_size",
                format!("must be a power of two from 2 to {MAX_QUEUE_SIZE}, got {}", self.queue_size),
            );
        }
        if self.max_dma_windows == 0 || self.max_dma_windows > crate::memory::MAX_DMA_MAPS {
            return invalid(
                "max_dma_windows",
                format!("must be 1 to {}, got {}", crate::memory::MAX_DMA_MAPS, self.max_dma_windows),
            );
        }
        if self.max_dma_mib == 0 || self.max_dma_mib > (u64::MAX >> 20) {
            return invalid("max_dma_mib", format!("must be at least 1, got {}", self.max_dma_mib));
        }
        let mut sorted = self.poller_cores.clone();
        sorted.sort_unstable();
        if sorted.windows(2).any(|w| w[0] == w[1]) {
            return invalid("poller_cores", "a core is listed twice".into());
        }
        let servable = match self.queue_mapping {
            QueueMapping::Spread => usize::from(self.request_queues) + 1,
            QueueMapping::RequestQueues => usize::from(self.request_queues),
        };
        if self.poller_cores.len() > servable {
            return invalid(
                "poller_cores",
                format!(
                    "{} pollers for {servable} queues (queue_mapping {:?}): each poller needs at least one queue",
                    self.poller_cores.len(),
                    self.queue_mapping
                ),
            );
        }
        if self.idle_sleep_us == 0 || self.idle_sleep_us > 100_000 {
            return invalid("idle_sleep_us", format!("must be 1 to 100000, got {}", self.idle_sleep_us));
        }
        if self.remove_timeout_ms > MAX_REMOVE_TIMEOUT_MS {
            return invalid(
                "remove_timeout_ms",
                format!("must be at most {MAX_REMOVE_TIMEOUT_MS}, got {}", self.remove_timeout_ms),
            );
        }
        if self.idle_spin_us > 10_000_000 {
            return invalid("idle_spin_us", format!("must be at most 10000000, got {}", self.idle_spin_us));
        }
        Ok(())
    }

    /// Checks the profile fits this machine: every poller core is a CPU id this process may run
    /// on (its affinity mask, as `taskset` or a cpuset sets it), not merely a number below the
    /// count of usable CPUs. Separate from [`Profile::validate`] so that profiles of other
    /// hardware can be checked anywhere.
    pub fn check_machine(&self) -> Result<(), ConfigError> {
        let Some(allowed) = allowed_cpus() else { return Ok(()) };
        if let Some(c) = self.poller_cores.iter().find(|c| !allowed.contains(c)) {
            return Err(ConfigError::Invalid {
                key: "poller_cores",
                reason: format!("CPU {c} is not one this process may use (allowed: {})", cpu_list(&allowed)),
            });
        }
        Ok(())
    }

    /// The CPU the device's control plane runs on when pollers are pinned: the first CPU this
    /// process may use that no poller takes, so a busy poller keeps its core to itself; `None`
    /// when no poller is pinned or every allowed CPU has one (then the control plane floats).
    pub fn control_cpu(&self) -> Option<usize> {
        if self.poller_cores.is_empty() {
            return None;
        }
        allowed_cpus()?.into_iter().find(|c| !self.poller_cores.contains(c))
    }

    /// The DMA table's limits (windows, bytes, descriptors kept free).
    pub fn dma_limits(&self) -> crate::memory::Limits {
        crate::memory::Limits {
            max_windows: self.max_dma_windows,
            max_bytes: self.max_dma_mib << 20,
            fd_reserve: self.fd_reserve,
        }
    }

    /// Whether doorbells come through the socket (and wake parked pollers) rather than staying in
    /// shared memory; `auto` picks the socket exactly when pollers may park.
    pub fn doorbells_on_socket(&self) -> bool {
        match self.doorbells {
            Doorbells::Shared => false,
            Doorbells::Socket => true,
            Doorbells::Auto => self.polling == Polling::Adaptive,
        }
    }

    /// The poller (0..[`Self::pollers`]) that serves queue `queue` (0 = hiprio).
    pub fn poller_of(&self, queue: u16) -> usize {
        let p = self.pollers();
        match self.queue_mapping {
            QueueMapping::Spread => usize::from(queue) % p,
            QueueMapping::RequestQueues => usize::from(queue.saturating_sub(1)) % p,
        }
    }

    /// Number of pollers this profile asks for (at least one).
    pub fn pollers(&self) -> usize {
        self.poller_cores.len().max(1)
    }
}

/// Where one function's queues run among the pollers of a (possibly shared) pool: queue `q`
/// goes to `pollers[(mapping(q) + offset) % pollers.len()]`, `mapping` being the function's
/// [`QueueMapping`] over that many pollers. A single-function device is
/// [`Placement::of_profile`]: every poller, offset 0, exactly [`Profile::poller_of`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Placement {
    /// The pool's pollers this function uses (indices into the pool, ascending, no repeats).
    pub pollers: Vec<usize>,
    /// How many pollers the pool has.
    pub pool_pollers: usize,
    /// The pool's cores by poller (`None`: unpinned).
    pub cores: Vec<Option<usize>>,
    /// The function's queue mapping over `pollers`.
    pub mapping: QueueMapping,
    /// Rotation of the mapping (functions of one daemon are spread by their ordinal, so that
    /// every function's hiprio queue does not land on the same poller).
    pub offset: usize,
}

impl Placement {
    /// Every poller `profile` asks for, in its mapping, unrotated: the single-function device.
    pub fn of_profile(profile: &Profile) -> Self {
        let n = profile.pollers();
        Placement {
            pollers: (0..n).collect(),
            pool_pollers: n,
            cores: cores_of(profile),
            mapping: profile.queue_mapping,
            offset: 0,
        }
    }

    /// The pool poller that serves queue `queue` (0 = hiprio).
    pub fn poller_of(&self, queue: u16) -> usize {
        let n = self.pollers.len().max(1);
        let base = match self.mapping {
            QueueMapping::Spread => usize::from(queue),
            QueueMapping::RequestQueues => usize::from(queue.saturating_sub(1)),
        };
        self.pollers.get((base + self.offset) % n).copied().unwrap_or(0)
    }
}

/// The cores of `profile`'s pollers (`[None]`: one unpinned poller).
pub fn cores_of(profile: &Profile) -> Vec<Option<usize>> {
    if profile.poller_cores.is_empty() {
        vec![None]
    } else {
        profile.poller_cores.iter().map(|&c| Some(c)).collect()
    }
}

/// The CPU ids this process may run on (its affinity mask), ascending; `None` if the system does
/// not say.
pub fn allowed_cpus() -> Option<Vec<usize>> {
    let mut ids: Vec<usize> = core_affinity::get_core_ids()?.into_iter().map(|c| c.id).collect();
    ids.sort_unstable();
    Some(ids)
}

/// `0-3,6` for `[0, 1, 2, 3, 6]`.
fn cpu_list(ids: &[usize]) -> String {
    let mut out = String::new();
    let mut i = 0;
    while i < ids.len() {
        let start = ids[i];
        let mut end = start;
        while i + 1 < ids.len() && ids[i + 1] == end + 1 {
            i += 1;
            end = ids[i];
        }
        if !out.is_empty() {
            out.push(',');
        }
        if end == start {
            out.push_str(&start.to_string());
        } else {
            out.push_str(&format!("{start}-{end}"));
        }
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key_of(text: &str) -> String {
        match Profile::from_toml(text) {
            Err(ConfigError::Invalid { key, .. }) => key.to_string(),
            Err(ConfigError::Parse(e)) => e.to_string(),
            other => panic!("expected an error, got {other:?}"),
        }
    }

    #[test]
    fn defaults_are_valid() {
        Profile::default().validate().unwrap();
        assert_eq!(Profile::from_toml("").unwrap(), Profile::default());
    }

    #[test]
    fn full_profile_parses() {
        let p = Profile::from_toml(
            "description = \"x\"\ntag = \"fs\"\nrequest_queues = 4\nqueue_size = 1024\npoller_cores = [0]\n",
        )
        .unwrap();
        assert_eq!((p.tag.as_str(), p.request_queues, p.queue_size), ("fs", 4, 1024));
        assert_eq!(p.pollers(), 1);
    }

    #[test]
    fn bad_values_name_their_key() {
        assert_eq!(key_of("queue_size = 100"), "queue_size");
        assert_eq!(key_of("queue_size = 0"), "queue_size");
        assert_eq!(key_of("request_queues = 0"), "request_queues");
        assert_eq!(key_of("tag = \"\""), "tag");
        assert_eq!(key_of(&format!("tag = \"{}\"", "a".repeat(37))), "tag");
        let far = Profile::from_toml("request_queues = 4\npoller_cores = [100000]").unwrap();
        assert!(matches!(far.check_machine(), Err(ConfigError::Invalid { key: "poller_cores", .. })));
        assert_eq!(key_of("poller_cores = [0, 0]"), "poller_cores");
        // Core ids are CPU ids of the affinity mask, not counts: the highest allowed CPU is fine
        // (under `taskset -c 1` that is CPU 1 alone), and the control plane avoids it.
        let allowed = allowed_cpus().unwrap();
        let last = *allowed.last().unwrap();
        let p = Profile::from_toml(&format!("request_queues = 4\npoller_cores = [{last}]")).unwrap();
        p.check_machine().unwrap();
        let control = p.control_cpu();
        assert_ne!(control, Some(last));
        assert_eq!(control.is_some(), allowed.len() > 1);
        assert_eq!(Profile::default().control_cpu(), None);
        assert_eq!(cpu_list(&[0, 1, 2, 3, 6, 8, 9]), "0-3,6,8-9");
        assert_eq!(key_of("idle_sleep_us = 0"), "idle_sleep_us");
        assert!(key_of("polling = \"sometimes\"").contains("polling"));
        assert_eq!(Profile::from_toml("polling = \"busy\"").unwrap().polling, Polling::Busy);
        assert!(key_of("doorbells = \"mmap\"").contains("doorbells"));
    }

    #[test]
    fn queue_mappings() {
        let spread = Profile::from_toml("request_queues = 3\npoller_cores = [0, 1, 2, 3]").unwrap();
        assert_eq!((0..4).map(|q| spread.poller_of(q)).collect::<Vec<_>>(), [0, 1, 2, 3]);
        let rq = Profile::from_toml(
            "request_queues = 3\npoller_cores = [0, 1, 2]\nqueue_mapping = \"request-queues\"",
        )
        .unwrap();
        assert_eq!(
            (0..4).map(|q| rq.poller_of(q)).collect::<Vec<_>>(),
            [0, 0, 1, 2],
            "hiprio rides on poller 0"
        );
        let two = Profile { poller_cores: vec![0, 1], ..rq.clone() };
        assert_eq!((0..4).map(|q| two.poller_of(q)).collect::<Vec<_>>(), [0, 0, 1, 0]);
        // request-queues has one queue fewer to hand out.
        assert_eq!(
            key_of("request_queues = 1\npoller_cores = [0, 1]\nqueue_mapping = \"request-queues\""),
            "poller_cores"
        );
        assert!(key_of("queue_mapping = \"random\"").contains("queue_mapping"));
    }

    #[test]
    fn doorbells_follow_the_polling_mode_unless_set() {
        let on_socket = |t: &str| Profile::from_toml(t).unwrap().doorbells_on_socket();
        assert!(on_socket(""), "adaptive by default: parked pollers wake on doorbells");
        assert!(!on_socket("polling = \"busy\""), "busy pollers never park: shared memory");
        assert!(on_socket("polling = \"busy\"\ndoorbells = \"socket\""));
        assert!(!on_socket("doorbells = \"shared\""));
    }

    #[test]
    fn shipped_profiles_are_valid() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../hw-configs");
        let mut n = 0;
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "toml") {
                let p = Profile::from_file(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                assert!(!p.description.is_empty(), "{} has no description", path.display());
                n += 1;
            }
        }
        assert!(n >= 2, "profiles found: {n}");
    }

    #[test]
    fn unknown_and_mistyped_keys_are_rejected() {
        assert!(key_of("queue_sise = 128").contains("queue_sise"));
        assert!(key_of("queue_size = \"big\"").contains("queue_size"));
        assert!(key_of("queue_size = 70000").contains("queue_size"));
    }
}
