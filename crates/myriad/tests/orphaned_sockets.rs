//! Sockets the node gives up on leave nothing behind in the kernel (issue
//! 10): a stalled reader's socket that still holds unsent data when the
//! node drops it (at the close timeout after a slow-consumer cut, on a
//! heartbeat timeout, at the shutdown timeout) is aborted, so the kernel
//! does not keep that data for as long as the reader advertises a zero
//! window; a socket whose data was all sent still gets the ordinary close.

mod common;

use std::time::{Duration, Instant};

use common::{kernel_sockets, node_side, Node, Ws, CLOSE_WAIT};
use tungstenite::stream::MaybeTlsStream;
use tungstenite::Message;

/// Stalled readers: enough that a leak is plain, few enough for the
/// 20,000 descriptors of each process.
const READERS: usize = 300;

fn port(ws: &Ws) -> u16 {
    match ws.get_ref() {
        MaybeTlsStream::Plain(s) => s.local_addr().unwrap().port(),
        _ => unreachable!("plain sockets only"),
    }
}

/// A node with small send buffers (16 KiB), so that [`flood`] leaves
/// stalled readers with unsent data, and `extra` flags.
fn stalling_node(extra: &[&str]) -> Node {
    let mut flags = vec!["--workers", "2", "--socket-send-buffer", "8192"];
    flags.extend_from_slice(extra);
    Node::start(&flags)
}

/// `count` readers subscribed to `firehose` that never read; their ports.
fn stalled_readers(node: &Node, count: usize) -> (Vec<Ws>, Vec<u16>) {
    let readers: Vec<Ws> = (0..count)
        .map(|_| node.stalled_subscriber("firehose"))
        .collect();
    let ports = readers.iter().map(port).collect();
    (readers, ports)
}

/// Publishes 160 KB to `firehose`: past a stalled reader's buffers (4 KiB
/// to receive, 16 KiB to send with `--socket-send-buffer 8192`).
fn flood(node: &Node) {
    let chunk = "x".repeat(8 * 1024);
    for batch in 0..2 {
        node.publish_batch("firehose", batch, 10, &chunk);
    }
}

/// Waits (up to 5 s) until the kernel holds no socket of the node's port
/// connected to one of `ports`.
fn assert_gone_from_the_kernel(node_port: u16, ports: &[u16]) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let left: Vec<_> = kernel_sockets()
            .into_iter()
            .filter(|s| s.local_port == node_port && ports.contains(&s.remote_port))
            .collect();
        if left.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{} of the node's sockets to {} stalled readers are still in the kernel, e.g. {:?}",
            left.len(),
            ports.len(),
            left[0]
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn stalled_readers_cut_as_slow_consumers_leave_no_socket_in_the_kernel() {
    let node = stalling_node(&["--max-outbound-bytes", "65536", "--close-timeout", "1"]);
    let (readers, reader_ports) = stalled_readers(&node, READERS);

    // The control: refused for a binary message, it takes the close frame
    // (its kernel acknowledges it) but never answers, so it too is dropped
    // at the close timeout, with nothing left to send.
    let mut control = node.connect();
    control.send(Message::binary(vec![1, 2, 3])).unwrap();

    // Past each reader's buffers and its 64 KiB queue: every one is cut.
    flood(&node);
    node.wait_for_stats("every reader cut, every connection gone", |s| {
        s["slow_consumer_disconnects"] == READERS && s["connections"] == 0
    });
    // The node has let go of them all; the kernel must have too.
    assert_gone_from_the_kernel(node.ws.port(), &reader_ports);
    assert_eq!(node.metric("myriad_sockets_aborted_total"), READERS as u64);

    // The control got a FIN, not a reset: its own socket waits in
    // CLOSE_WAIT for it to close (a reset would have removed it).
    let MaybeTlsStream::Plain(control_socket) = control.get_ref() else {
        unreachable!("plain sockets only")
    };
    let client_port = control_socket.local_addr().unwrap().port();
    let control_side = kernel_sockets()
        .into_iter()
        .find(|s| s.local_port == client_port && s.remote_port == node.ws.port());
    assert_eq!(control_side.map(|s| s.state), Some(CLOSE_WAIT));
    assert!(
        node_side(&node, control_socket).is_none_or(|s| s.inode == 0 && s.tx_queue == 0),
        "the node let go of the control's socket with nothing left to send"
    );
    drop(readers);
}

#[test]
fn stalled_readers_silent_past_the_heartbeat_timeout_leave_no_socket_in_the_kernel() {
    let node = stalling_node(&["--heartbeat-interval", "1", "--heartbeat-timeout", "1"]);
    let (readers, ports) = stalled_readers(&node, READERS / 3);
    // Within their 1 MiB queues: nobody is cut, but no window is open.
    flood(&node);
    node.wait_for_stats("every reader timed out", |s| {
        s["closes"]["heartbeat_timeout"] == ports.len() && s["connections"] == 0
    });
    assert_gone_from_the_kernel(node.ws.port(), &ports);
    assert_eq!(
        node.metric("myriad_sockets_aborted_total"),
        ports.len() as u64
    );
    drop(readers);
}

#[test]
fn stalled_readers_held_at_the_shutdown_timeout_leave_no_socket_in_the_kernel() {
    let mut node = stalling_node(&["--shutdown-timeout", "1"]);
    let (readers, ports) = stalled_readers(&node, READERS / 3);
    flood(&node);
    // Each reader's `subscribed` answer and the 20 publications queued.
    node.wait_for_stats("every reader's queue past its window", |s| {
        s["messages_out"] == 21 * ports.len()
    });
    node.terminate();
    node.wait_for_exit();
    // The node is gone; sockets closed normally would outlive it.
    assert_gone_from_the_kernel(node.ws.port(), &ports);
    drop(readers);
}
