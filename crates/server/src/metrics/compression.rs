//! permessage-deflate's series, copied in from the node's `deflate` counts.

use std::sync::atomic::AtomicU64;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use super::{catch_up, registered, ReasonLabel};

/// The node's permessage-deflate series.
pub(super) struct CompressionMetrics {
    frames: Counter<u64, AtomicU64>,
    bytes_before: Counter<u64, AtomicU64>,
    bytes_after: Counter<u64, AtomicU64>,
    seconds: Counter<f64, AtomicU64>,
    incompressible: Counter<u64, AtomicU64>,
    negotiated: Counter<u64, AtomicU64>,
    declined: Family<ReasonLabel, Counter>,
    refused: Family<ReasonLabel, Counter>,
}

impl CompressionMetrics {
    pub(super) fn new(r: &mut Registry) -> CompressionMetrics {
        let compression = CompressionMetrics {
            frames: registered(
                r,
                "compression_frames",
                "Publication frames compressed for permessage-deflate (once per node each)",
            ),
            bytes_before: registered(
                r,
                "compression_bytes_before",
                "Payload bytes of compressed frames before compression",
            ),
            bytes_after: registered(
                r,
                "compression_bytes_after",
                "Payload bytes of compressed frames after compression",
            ),
            seconds: registered(
                r,
                "compression_seconds",
                "Time spent compressing frames",
            ),
            incompressible: registered(
                r,
                "compression_incompressible",
                "Frames above compression_threshold that compression did not shrink, sent uncompressed",
            ),
            negotiated: registered(
                r,
                "compression_negotiated",
                "WebSocket upgrades that negotiated permessage-deflate",
            ),
            declined: registered(
                r,
                "compression_offers_declined",
                "permessage-deflate offers declined (RFC 7692 §5), by reason",
            ),
            refused: registered(
                r,
                "compression_refusals",
                "Compressed client input refused (connection closed), by reason",
            ),
        };
        for decline in myriad_protocol::ws::deflate::Decline::ALL {
            drop(compression.declined.get_or_create(&ReasonLabel {
                reason: decline.name(),
            }));
        }
        for refusal in crate::deflate::Refusal::ALL {
            drop(compression.refused.get_or_create(&ReasonLabel {
                reason: refusal.name(),
            }));
        }
        compression
    }

    /// Copies the node's compression counts in, before metrics are read.
    pub(super) fn mirror(&self, counts: &crate::deflate::DeflateCounts) {
        use std::sync::atomic::Ordering::Relaxed;
        let c = self;
        catch_up(&c.frames, counts.frames.load(Relaxed));
        catch_up(&c.bytes_before, counts.bytes_before.load(Relaxed));
        catch_up(&c.bytes_after, counts.bytes_after.load(Relaxed));
        catch_up(&c.incompressible, counts.incompressible.load(Relaxed));
        catch_up(&c.negotiated, counts.negotiated.load(Relaxed));
        let seconds = counts.nanos.load(Relaxed) as f64 / 1e9;
        let behind = seconds - c.seconds.get();
        if behind > 0.0 {
            c.seconds.inc_by(behind);
        }
        for (decline, total) in myriad_protocol::ws::deflate::Decline::ALL
            .iter()
            .zip(&counts.declined)
        {
            let label = ReasonLabel {
                reason: decline.name(),
            };
            catch_up(&c.declined.get_or_create(&label), total.load(Relaxed));
        }
        for (refusal, total) in crate::deflate::Refusal::ALL.iter().zip(&counts.refused) {
            let label = ReasonLabel {
                reason: refusal.name(),
            };
            catch_up(&c.refused.get_or_create(&label), total.load(Relaxed));
        }
    }
}
