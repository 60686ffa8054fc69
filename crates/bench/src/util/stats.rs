//! The server's own figures as the bench reads them from myriad's
//! `GET /stats` answers: a pure reading of JSON values, summed over nodes.
//!
//! Owns which /stats fields the bench charts and reports; fetching them is
//! the coordinator's poller (`coordinator/node_api.rs`), never done here.

use serde_json::Value;

/// The figures of /stats answers the bench charts and reports, summed over
/// the nodes that gave them.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct ServerFigures {
    /// Open connections.
    pub connections: u64,
    /// Messages written to clients.
    pub messages_out: u64,
    /// write/writev calls that carried them.
    pub socket_writes: u64,
    /// Resident memory, bytes.
    pub rss_bytes: u64,
    /// CPU time used, seconds.
    pub cpu_seconds: f64,
}

impl ServerFigures {
    /// Adds up the figures of every answer (missing ones count as 0).
    pub fn total(answers: &[Value]) -> ServerFigures {
        let u = |v: &Value| v.as_u64().unwrap_or(0);
        answers
            .iter()
            .fold(ServerFigures::default(), |sum, v| ServerFigures {
                connections: sum.connections + u(&v["connections"]),
                messages_out: sum.messages_out + u(&v["messages_out"]),
                socket_writes: sum.socket_writes + u(&v["socket_writes"]),
                rss_bytes: sum.rss_bytes + u(&v["process"]["rss_bytes"]),
                cpu_seconds: sum.cpu_seconds + v["process"]["cpu_seconds"].as_f64().unwrap_or(0.0),
            })
    }

    /// RSS per open connection, when there are any.
    pub fn rss_per_connection(&self) -> Option<f64> {
        (self.connections > 0).then(|| self.rss_bytes as f64 / self.connections as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_add_up_over_nodes() {
        let a = serde_json::json!({"connections": 10, "messages_out": 5, "socket_writes": 2,
            "process": {"rss_bytes": 1000, "cpu_seconds": 0.5}});
        let b = serde_json::json!({"connections": 30, "process": {"rss_bytes": 3000}});
        let t = ServerFigures::total(&[a, b]);
        assert_eq!((t.connections, t.messages_out, t.socket_writes), (40, 5, 2));
        assert_eq!(t.rss_bytes, 4000);
        assert_eq!(t.rss_per_connection(), Some(100.0));
        assert_eq!(ServerFigures::default().rss_per_connection(), None);
    }
}
