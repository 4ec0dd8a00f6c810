//! Prometheus metrics of rings, read from outside (feature `metrics`).
//!
//! A [`RingCollector`] reads each ring with [`inspect::status`] on every scrape, the way
//! `gpuring stat` does: it joins no ring and never touches the protocol state, so a scrape does
//! not disturb the rings it reads. A service that already exports metrics with
//! [`prometheus_client`] adds the rings' with [`register`]; `gpuring exporter` serves them over
//! HTTP. docs/metrics.md lists every metric.
//!
//! ```
//! use gpuring::metrics::{self, Rings};
//! use prometheus_client::registry::Registry;
//!
//! let _tx = gpuring::Producer::builder("doc-metrics-module").create()?;
//! let mut registry = Registry::default();
//! metrics::register(&mut registry, Rings::Names(vec!["doc-metrics-module".into()]));
//! let text = metrics::encode_text(&registry)?;
//! assert!(text.contains("gpuring_published_total{ring=\"doc-metrics-module\"} 0"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};

use crate::inspect::{self, RingStatus};
use crate::MemoryKind;

/// The HTTP `Content-Type` of what [`encode_text`] writes: the OpenMetrics text format 1.0.0,
/// which Prometheus scrapes natively.
///
/// ```
/// assert!(gpuring::metrics::CONTENT_TYPE.starts_with("application/openmetrics-text"));
/// ```
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Which rings a [`RingCollector`] reads.
///
/// ```
/// use gpuring::metrics::Rings;
///
/// let every_ring = Rings::All; // whatever /dev/shm holds at each scrape
/// let two = Rings::Names(vec!["camera".into(), "detections".into()]);
/// # let _ = (every_ring, two);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rings {
    /// Every ring in `/dev/shm` ([`inspect::ring_names`]), listed again at each scrape.
    All,
    /// These rings. One that cannot be read at a scrape (not there yet, or gone) has
    /// `gpuring_up 0` and no other metric.
    Names(Vec<String>),
}

/// A [`Collector`] of rings' counters: on each scrape it reads every ring of its [`Rings`] with
/// [`inspect::status`] and encodes them (docs/metrics.md lists the metrics).
///
/// `gpuring_publish_rate` is computed between two scrapes of the same collector, so the first
/// scrape of a ring (or of a new producer instance: a new epoch) has no rate sample.
///
/// ```
/// use gpuring::metrics::{RingCollector, Rings};
/// use prometheus_client::registry::Registry;
///
/// let mut registry = Registry::default();
/// registry.register_collector(Box::new(RingCollector::new(Rings::All)));
/// let text = gpuring::metrics::encode_text(&registry)?;
/// assert!(text.ends_with("# EOF\n"));
/// # Ok::<(), std::fmt::Error>(())
/// ```
#[derive(Debug)]
pub struct RingCollector {
    rings: Rings,
    /// Per ring: its epoch, when it was read, and its published count then (for the rate).
    last: Mutex<HashMap<String, (u64, Instant, u64)>>,
}

impl RingCollector {
    /// A collector of `rings`.
    ///
    /// ```
    /// use gpuring::metrics::{RingCollector, Rings};
    ///
    /// let collector = RingCollector::new(Rings::Names(vec!["camera".into()]));
    /// # let _ = collector;
    /// ```
    pub fn new(rings: Rings) -> Self {
        RingCollector { rings, last: Mutex::new(HashMap::new()) }
    }

    /// Reads the rings now: each name with its status, or `None` where it could not be read.
    fn read(&self) -> Vec<(String, Option<RingStatus>)> {
        let names = match &self.rings {
            // No /dev/shm (or unreadable): no rings to report.
            Rings::All => inspect::ring_names().unwrap_or_default(),
            Rings::Names(names) => names.clone(),
        };
        names
            .into_iter()
            .map(|name| {
                let status = inspect::status(&name).ok();
                (name, status)
            })
            .collect()
    }

    /// Messages per second since the previous scrape of each ring, and records this one.
    fn rates(&self, now: Instant, rings: &[&RingStatus]) -> Vec<Option<f64>> {
        // A poisoned lock only means a scrape panicked midway: the samples stay usable.
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let rates = rings
            .iter()
            .map(|s| {
                let prev = last.insert(s.name.clone(), (s.epoch, now, s.published));
                let (epoch, then, published) = prev?;
                let secs = now.duration_since(then).as_secs_f64();
                let new = s.published.checked_sub(published)?;
                (epoch == s.epoch && secs > 0.0).then(|| new as f64 / secs)
            })
            .collect();
        last.retain(|name, _| rings.iter().any(|s| &s.name == name));
        rates
    }
}

/// Labels of one sample.
type Labels = Vec<(&'static str, String)>;

/// One sample's value: counters and gauges, integral or not.
enum Value {
    Int(u64),
    Float(f64),
}

/// Encodes one metric family: its descriptor, then each of `rows`. A family with no rows is
/// left out.
fn family(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    kind: MetricType,
    rows: Vec<(Labels, Value)>,
) -> Result<(), std::fmt::Error> {
    if rows.is_empty() {
        return Ok(());
    }
    let mut metric = encoder.encode_descriptor(name, help, unit, kind)?;
    for (labels, value) in rows {
        let sample = metric.encode_family(&labels)?;
        match (kind, value) {
            (MetricType::Counter, Value::Int(v)) => ConstCounter::new(v).encode(sample)?,
            (MetricType::Counter, Value::Float(v)) => ConstCounter::new(v).encode(sample)?,
            // Counts here are far below i64::MAX; saturate rather than wrap if one is not.
            (_, Value::Int(v)) => {
                ConstGauge::new(i64::try_from(v).unwrap_or(i64::MAX)).encode(sample)?
            }
            (_, Value::Float(v)) => ConstGauge::new(v).encode(sample)?,
        }
    }
    Ok(())
}

impl Collector for RingCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        use MetricType::{Counter, Gauge};
        let read = self.read();
        let now = Instant::now();
        let rings: Vec<&RingStatus> = read.iter().filter_map(|(_, s)| s.as_ref()).collect();
        let rates = self.rates(now, &rings);
        let ring = |s: &RingStatus| -> Labels { vec![("ring", s.name.clone())] };
        let per_ring = |f: &dyn Fn(&RingStatus) -> Value| -> Vec<(Labels, Value)> {
            rings.iter().map(|s| (ring(s), f(s))).collect()
        };
        let e = &mut encoder;

        let up = read
            .iter()
            .map(|(name, s)| (vec![("ring", name.clone())], Value::Int(s.is_some() as u64)));
        family(
            e,
            "gpuring_up",
            "Whether the ring could be read at this scrape (1) or not (0)",
            None,
            Gauge,
            up.collect(),
        )?;
        let info = rings.iter().map(|s| {
            let memory = match s.memory {
                MemoryKind::Host => "host",
                MemoryKind::Cuda => "cuda",
            };
            let labels = vec![
                ("ring", s.name.clone()),
                ("memory", memory.to_owned()),
                ("policy", s.policy.name().to_owned()),
                ("producer_pid", s.producer_pid.to_string()),
            ];
            (labels, Value::Int(1))
        });
        family(
            e,
            "gpuring_ring_info",
            "The ring's memory kind, policy and producer pid, as labels (value 1)",
            None,
            Gauge,
            info.collect(),
        )?;
        family(
            e,
            "gpuring_published",
            "Messages the producer has published",
            None,
            Counter,
            per_ring(&|s| Value::Int(s.published)),
        )?;
        let rate =
            rings.iter().zip(&rates).filter_map(|(s, r)| r.map(|r| (ring(s), Value::Float(r))));
        family(
            e,
            "gpuring_publish_rate",
            "Messages published per second since this exporter's previous scrape",
            None,
            Gauge,
            rate.collect(),
        )?;
        family(
            e,
            "gpuring_producer_blocked",
            "Time the producer has spent waiting for a lossless consumer or for a free buffer",
            Some(&Unit::Seconds),
            Counter,
            per_ring(&|s| Value::Float(s.blocked_ns as f64 / 1e9)),
        )?;
        family(
            e,
            "gpuring_producer_blocked_now",
            "How long the producer's wait going on now has lasted (0 when it is not waiting)",
            Some(&Unit::Seconds),
            Gauge,
            per_ring(&|s| {
                Value::Float(s.blocked_now.as_ref().map_or(0.0, |b| b.for_ns as f64 / 1e9))
            }),
        )?;
        family(
            e,
            "gpuring_producer_alive",
            "Whether the producer process still runs (1) or not (0)",
            None,
            Gauge,
            per_ring(&|s| Value::Int(s.producer_alive as u64)),
        )?;
        family(
            e,
            "gpuring_closed",
            "Whether the producer closed the ring (1) or not (0)",
            None,
            Gauge,
            per_ring(&|s| Value::Int(s.closed as u64)),
        )?;
        family(
            e,
            "gpuring_context_lost",
            "Whether the producer closed the ring because its GPU context was lost (1) or not (0)",
            None,
            Gauge,
            per_ring(&|s| Value::Int(s.context_lost as u64)),
        )?;
        family(
            e,
            "gpuring_epoch",
            "The producer instance's epoch (changes when a new producer recreates the ring)",
            None,
            Gauge,
            per_ring(&|s| Value::Int(s.epoch)),
        )?;
        family(
            e,
            "gpuring_capacity",
            "Slots: the messages the ring holds",
            None,
            Gauge,
            per_ring(&|s| Value::Int(s.capacity.into())),
        )?;
        family(
            e,
            "gpuring_spares",
            "Spare buffers, swapped in for buffers that consumers hold",
            None,
            Gauge,
            per_ring(&|s| Value::Int(s.spares.into())),
        )?;
        family(
            e,
            "gpuring_held_buffers",
            "Buffers some consumer holds now",
            None,
            Gauge,
            per_ring(&|s| Value::Int(s.held_buffers as u64)),
        )?;
        family(
            e,
            "gpuring_consumers",
            "Joined consumers (active or evicted entries)",
            None,
            Gauge,
            per_ring(&|s| Value::Int(s.consumers.len() as u64)),
        )?;
        family(
            e,
            "gpuring_reclaims",
            "Dead consumers whose entries and buffers the producer took back",
            None,
            Counter,
            per_ring(&|s| Value::Int(s.reclaims)),
        )?;
        family(
            e,
            "gpuring_evictions",
            "Consumers the producer evicted for a failure of their own entry",
            None,
            Counter,
            per_ring(&|s| Value::Int(s.evictions)),
        )?;

        let consumers: Vec<(Labels, &crate::ConsumerInfo)> = rings
            .iter()
            .flat_map(|s| s.consumers.iter().map(move |c| (s, c)))
            .map(|(s, c)| {
                let labels = vec![
                    ("ring", s.name.clone()),
                    ("entry", c.index.to_string()),
                    ("pid", c.pid.to_string()),
                    ("mode", c.mode.map_or("invalid", crate::Mode::name).to_owned()),
                ];
                (labels, c)
            })
            .collect();
        let per_consumer = |f: &dyn Fn(&crate::ConsumerInfo) -> u64| -> Vec<(Labels, Value)> {
            consumers.iter().map(|(l, c)| (l.clone(), Value::Int(f(c)))).collect()
        };
        family(
            e,
            "gpuring_consumer_lag",
            "Messages published that the consumer has not received yet",
            None,
            Gauge,
            per_consumer(&|c| c.lag),
        )?;
        family(
            e,
            "gpuring_consumer_received",
            "Messages the consumer has received",
            None,
            Counter,
            per_consumer(&|c| c.received),
        )?;
        family(e, "gpuring_consumer_lost", "Messages the consumer lost: overwritten before it read them (queue) or skipped (latest)", None, Counter, per_consumer(&|c| c.lost))?;
        family(
            e,
            "gpuring_consumer_held",
            "Messages the consumer holds now",
            None,
            Gauge,
            per_consumer(&|c| c.holding),
        )?;
        family(
            e,
            "gpuring_consumer_alive",
            "Whether the consumer process still runs (1) or not (0)",
            None,
            Gauge,
            per_consumer(&|c| c.alive as u64),
        )?;
        family(
            e,
            "gpuring_consumer_parked",
            "Whether the consumer is parked in an async receive (1) or not (0)",
            None,
            Gauge,
            per_consumer(&|c| c.parked as u64),
        )?;
        family(
            e,
            "gpuring_consumer_evicted",
            "Whether the producer evicted the consumer (1) or not (0)",
            None,
            Gauge,
            per_consumer(&|c| c.evicted as u64),
        )?;
        self.encode_batches(e, &rings)
    }
}

impl RingCollector {
    /// The cameras of the rings that a batcher publishes (`gpuring::batch`), from its status
    /// file: each camera's state in the last batch (1 for that state, 0 for the others), and
    /// the batches it was in, per state.
    fn encode_batches(
        &self,
        e: &mut DescriptorEncoder<'_>,
        rings: &[&RingStatus],
    ) -> Result<(), std::fmt::Error> {
        use crate::batch::{BatchStatus, CameraState, Totals};
        use MetricType::{Counter, Gauge};
        let batches: Vec<(&RingStatus, BatchStatus)> = rings
            .iter()
            .filter_map(|s| Some((*s, BatchStatus::read(&s.dir, &s.name).ok().flatten()?)))
            .collect();
        let states =
            [CameraState::Present, CameraState::Stale, CameraState::Absent, CameraState::Refused];
        let mut now = Vec::new();
        let mut counts = Vec::new();
        for (s, b) in &batches {
            for (k, i) in b.inputs.iter().enumerate() {
                for state in states {
                    let labels = vec![
                        ("ring", s.name.clone()),
                        ("camera", k.to_string()),
                        ("input", i.ring.clone()),
                        ("state", state.name().to_owned()),
                    ];
                    now.push((labels.clone(), Value::Int((i.state == state) as u64)));
                    counts.push((labels, Value::Int(i.counts[Totals::index(state)])));
                }
            }
        }
        family(
            e,
            "gpuring_batch_camera_state",
            "A batcher's camera: 1 for its state in the last batch (present, stale, absent, refused)",
            None,
            Gauge,
            now,
        )?;
        family(
            e,
            "gpuring_batch_camera_batches",
            "Batches a batcher's camera was in, per state",
            None,
            Counter,
            counts,
        )
    }
}

/// Registers a [`RingCollector`] of `rings` in `registry`: a service that already exports
/// metrics with [`prometheus_client`] adds the rings' to its own.
///
/// ```
/// use gpuring::metrics::{self, Rings};
/// use prometheus_client::registry::Registry;
///
/// let _tx = gpuring::Producer::builder("doc-metrics-register").capacity(8).create()?;
/// let mut registry = Registry::default();
/// metrics::register(&mut registry, Rings::Names(vec!["doc-metrics-register".into()]));
/// let text = metrics::encode_text(&registry)?;
/// assert!(text.contains("gpuring_capacity{ring=\"doc-metrics-register\"} 8"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn register(registry: &mut Registry, rings: Rings) {
    registry.register_collector(Box::new(RingCollector::new(rings)));
}

/// Encodes everything in `registry` in the OpenMetrics text format (served as
/// [`CONTENT_TYPE`]), ending with its `# EOF` line.
///
/// A [`RingCollector`] never fails; the error is that of another collector registered in the
/// same registry.
///
/// ```
/// use prometheus_client::registry::Registry;
///
/// let text = gpuring::metrics::encode_text(&Registry::default())?;
/// assert_eq!(text, "# EOF\n");
/// # Ok::<(), std::fmt::Error>(())
/// ```
pub fn encode_text(registry: &Registry) -> Result<String, std::fmt::Error> {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry)?;
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sample line of `metric` whose labels start with `labels`, if any.
    fn sample<'a>(text: &'a str, metric: &str, labels: &str) -> Option<&'a str> {
        let prefix = format!("{metric}{{{labels}");
        text.lines().find(|l| l.starts_with(&prefix))
    }

    #[test]
    fn encodes_a_batchers_cameras() {
        use crate::batch::{BatchStatus, CameraState, InputStatus};
        let name = format!("metrics-batch-{}", std::process::id());
        let tx = crate::Producer::builder(&name).capacity(4).create().unwrap();
        let cam = |ring: &str, state, counts| InputStatus {
            ring: ring.into(),
            state,
            epoch: 1,
            seq: 2,
            timestamp_ns: 3,
            counts,
        };
        let inputs = vec![
            cam("cam0", CameraState::Present, [5, 1, 0, 0]),
            cam("cam1", CameraState::Absent, [2, 0, 4, 0]),
        ];
        let dir = crate::shm::default_dir();
        BatchStatus { batches: 6, updated_ns: 1, inputs }.write(&dir, &name).unwrap();
        let mut registry = Registry::default();
        register(&mut registry, Rings::Names(vec![name.clone()]));
        let text = encode_text(&registry).unwrap();
        BatchStatus::remove(&dir, &name);
        let labels = |k: u32, input: &str, state: &str| {
            format!("ring=\"{name}\",camera=\"{k}\",input=\"{input}\",state=\"{state}\"")
        };
        let value = |m: &str, l: String| {
            let line = sample(&text, m, &l).unwrap_or_else(|| panic!("no {m}{{{l}: {text}"));
            line.rsplit(' ').next().unwrap().to_owned()
        };
        assert_eq!(value("gpuring_batch_camera_state", labels(0, "cam0", "present")), "1");
        assert_eq!(value("gpuring_batch_camera_state", labels(0, "cam0", "absent")), "0");
        assert_eq!(value("gpuring_batch_camera_state", labels(1, "cam1", "absent")), "1");
        assert_eq!(value("gpuring_batch_camera_batches_total", labels(1, "cam1", "absent")), "4");
        assert_eq!(value("gpuring_batch_camera_batches_total", labels(0, "cam0", "stale")), "1");
        drop(tx);
    }

    #[test]
    fn encodes_a_ring_and_its_consumer() {
        let name = format!("metrics-unit-{}", std::process::id());
        let mut tx = crate::Producer::builder(&name).capacity(4).create().unwrap();
        let rx = crate::Consumer::open(&name).unwrap();
        for _ in 0..3 {
            tx.send(b"x", b"").unwrap();
        }
        let msg = rx.recv().unwrap();
        let mut registry = Registry::default();
        register(&mut registry, Rings::Names(vec![name.clone(), "metrics-unit-missing".into()]));

        let text = encode_text(&registry).unwrap();
        let ring = format!("ring=\"{name}\"");
        let pid = std::process::id();
        let line =
            |m: &str, l: &str| sample(&text, m, l).unwrap_or_else(|| panic!("no {m}{{{l}: {text}"));
        assert_eq!(line("gpuring_up", &ring), format!("gpuring_up{{{ring}}} 1"));
        assert_eq!(
            line("gpuring_up", "ring=\"metrics-unit-missing\""),
            "gpuring_up{ring=\"metrics-unit-missing\"} 0"
        );
        assert_eq!(
            line("gpuring_published_total", &ring),
            format!("gpuring_published_total{{{ring}}} 3")
        );
        assert_eq!(line("gpuring_capacity", &ring), format!("gpuring_capacity{{{ring}}} 4"));
        assert_eq!(
            line("gpuring_producer_alive", &ring),
            format!("gpuring_producer_alive{{{ring}}} 1")
        );
        assert!(line("gpuring_producer_blocked_seconds_total", &ring).ends_with(" 0.0"));
        assert!(line("gpuring_producer_blocked_now_seconds", &ring).ends_with(" 0.0"));
        assert!(
            sample(&text, "gpuring_publish_rate", &ring).is_none(),
            "no rate at the first scrape"
        );
        assert!(text.contains("# TYPE gpuring_published counter\n"));
        assert!(text.contains("# UNIT gpuring_producer_blocked_seconds seconds\n"));
        let consumer = format!("{ring},entry=\"0\",pid=\"{pid}\",mode=\"");
        assert!(line("gpuring_consumer_lag", &consumer).ends_with("} 2"));
        assert!(line("gpuring_consumer_received_total", &consumer).ends_with("} 1"));
        assert!(line("gpuring_consumer_held", &consumer).ends_with("} 1"));
        assert!(line("gpuring_consumer_alive", &consumer).ends_with("} 1"));
        assert!(line("gpuring_consumer_lost_total", &consumer).ends_with("} 0"));
        assert!(text.ends_with("# EOF\n"));
        drop(msg);

        tx.send(b"x", b"").unwrap();
        let text = encode_text(&registry).unwrap();
        let rate =
            sample(&text, "gpuring_publish_rate", &ring).expect("a rate at the second scrape");
        let rate: f64 = rate.rsplit(' ').next().unwrap().parse().unwrap();
        assert!(rate > 0.0, "{rate}");
        assert!(sample(&text, "gpuring_consumer_held", &consumer).unwrap().ends_with("} 0"));
    }
}
