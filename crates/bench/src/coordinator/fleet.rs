//! The coordinator's side of the worker processes: spawning them, talking
//! to them, and making sure none outlives the run.
//!
//! Each worker is this same binary re-executed as `bench __worker`. One
//! thread per worker reads its stdout lines into a single channel, so the
//! coordinator waits on one queue for all of them.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::Duration;

use crossbeam_channel::Receiver;

use crate::schema::{Control, Msg, Spec};
use crate::util::error::BenchError;

/// What one worker said, or that it is gone.
#[derive(Debug)]
pub enum Event {
    /// A line from the worker.
    Msg(Msg),
    /// Its stdout closed: it exited.
    Exited,
}

/// The running worker processes, numbered in spawn order.
pub struct Fleet {
    children: Vec<Child>,
    stdins: Vec<Option<ChildStdin>>,
    rx: Receiver<(usize, Event)>,
    tx: crossbeam_channel::Sender<(usize, Event)>,
}

impl Fleet {
    /// No workers yet.
    pub fn new() -> Fleet {
        let (tx, rx) = crossbeam_channel::unbounded();
        Fleet {
            children: Vec::new(),
            stdins: Vec::new(),
            rx,
            tx,
        }
    }

    /// Starts a worker with `spec`; returns its id.
    pub fn spawn(&mut self, spec: &Spec) -> Result<usize, BenchError> {
        let exe = std::env::current_exe()?;
        let mut child = Command::new(exe)
            .args(["bench", "__worker"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let id = self.children.len();
        let mut stdin = child.stdin.take().ok_or(BenchError::WorkerLost(id))?;
        let stdout = child.stdout.take().ok_or(BenchError::WorkerLost(id))?;
        serde_json::to_writer(&mut stdin, spec)?;
        stdin.write_all(b"\n")?;
        stdin.flush()?;
        let tx = self.tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                match serde_json::from_str::<Msg>(&line) {
                    Ok(msg) => {
                        if tx.send((id, Event::Msg(msg))).is_err() {
                            return;
                        }
                    }
                    // Not ours (a stray print): show it rather than lose it.
                    Err(_) => eprintln!("worker {id}: {line}"),
                }
            }
            let _ = tx.send((id, Event::Exited));
        });
        self.children.push(child);
        self.stdins.push(Some(stdin));
        Ok(id)
    }

    /// Sends `c` to the workers `ids`. A worker that has gone is skipped:
    /// its exit is reported through [`recv`](Self::recv).
    pub fn send(&mut self, ids: &[usize], c: Control) {
        let line = serde_json::to_string(&c).unwrap_or_default() + "\n";
        for &id in ids {
            if let Some(stdin) = self.stdins.get_mut(id).and_then(Option::as_mut) {
                if stdin
                    .write_all(line.as_bytes())
                    .and_then(|()| stdin.flush())
                    .is_err()
                {
                    self.stdins[id] = None;
                }
            }
        }
    }

    /// The next worker event, waiting at most `wait`.
    pub fn recv(&self, wait: Duration) -> Option<(usize, Event)> {
        self.rx.recv_timeout(wait).ok()
    }
}

impl Default for Fleet {
    fn default() -> Self {
        Fleet::new()
    }
}

impl Drop for Fleet {
    /// Workers exit when their stdin closes; give them a moment, then kill
    /// the stragglers so no load generator outlives its run.
    fn drop(&mut self) {
        self.stdins.clear();
        for child in &mut self.children {
            for _ in 0..50 {
                if matches!(child.try_wait(), Ok(Some(_))) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            if matches!(child.try_wait(), Ok(None)) {
                let _ = child.kill();
            }
            let _ = child.wait();
        }
    }
}
