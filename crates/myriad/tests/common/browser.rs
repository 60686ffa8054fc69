//! A real headless Chromium, driven over the DevTools protocol, for the
//! tests that involve a page: start it, open a page, evaluate script in it.
//! Chromium comes from `scripts/install-test-deps.sh`; without it these
//! tests fail, they do not skip.

use std::io::ErrorKind;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};
use tungstenite::Message;

use super::Ws;

/// How long anything in a browser may take on a busy two-core box:
/// generous, since every wait ends as soon as what it waits for is seen.
pub const DEADLINE: Duration = Duration::from_secs(30);

/// A headless Chromium with one page open, driven over the DevTools
/// protocol. Closed when dropped.
pub struct Browser {
    process: Launched,
    devtools: Ws,
    /// The DevTools session attached to our page.
    session: String,
    next_id: u64,
}

/// A scratch folder, removed when dropped.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Chromium's process and its folder (profile and log). Dropping it, however
/// the test ends, kills Chromium with every process it started, then
/// removes the folder.
struct Launched {
    child: Child,
    dir: Scratch,
}

impl Drop for Launched {
    fn drop(&mut self) {
        let group = i32::try_from(self.child.id()).unwrap();
        // SAFETY: kill only sends a signal, here to the group Chromium led.
        unsafe { libc::kill(-group, libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

impl Browser {
    /// Starts Chromium and opens `url` in a new page.
    pub fn open(url: &str) -> Browser {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let dir = Scratch(
            std::env::temp_dir().join(format!("myriad-browser-{}-{nanos}", std::process::id())),
        );
        let profile = dir.0.join("profile");
        std::fs::create_dir_all(&profile).unwrap();
        let log = std::fs::File::create(dir.0.join("chromium.log")).unwrap();
        let spawned = Command::new("chromium")
            .args([
                "--headless=new",
                // Root in a container: Chromium's sandbox cannot start.
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--no-default-browser-check",
                "--disable-extensions",
                "--disable-sync",
                "--disable-background-networking",
                // The page is never in front of anyone: keep its timers and
                // rendering at full speed anyway.
                "--disable-background-timer-throttling",
                "--disable-renderer-backgrounding",
                "--disable-backgrounding-occluded-windows",
                // Port 0: Chromium picks one and writes it to
                // DevToolsActivePort in the profile, so nothing can collide.
                "--remote-debugging-port=0",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            // Its own process group, so that dropping the browser can end
            // the renderers and helpers it starts as well.
            .process_group(0)
            .spawn();
        let child = match spawned {
            Ok(child) => child,
            Err(e) if e.kind() == ErrorKind::NotFound => panic!(
                "chromium is not on PATH: the status page test needs a real browser; \
                 run scripts/install-test-deps.sh (it installs Debian's chromium)"
            ),
            Err(e) => panic!("cannot start chromium: {e}"),
        };
        let process = Launched { child, dir };
        let mut browser = Browser {
            devtools: connect_devtools(&profile, &process.dir.0),
            process,
            session: String::new(),
            next_id: 0,
        };
        let target = browser.call("Target.createTarget", json!({"url": url}));
        let attached = browser.call(
            "Target.attachToTarget",
            json!({"targetId": target["targetId"], "flatten": true}),
        );
        browser.session = attached["sessionId"].as_str().unwrap().to_owned();
        browser
    }

    /// Sends a DevTools command (to our page's session once attached) and
    /// returns its result, skipping the events that arrive meanwhile.
    pub fn call(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let mut command = json!({"id": id, "method": method, "params": params});
        if !self.session.is_empty() {
            command["sessionId"] = json!(self.session);
        }
        self.devtools
            .send(Message::text(command.to_string()))
            .unwrap();
        loop {
            let reply = match self.devtools.read().expect("a DevTools reply") {
                Message::Text(text) => serde_json::from_str::<Value>(text.as_str()).unwrap(),
                _ => continue,
            };
            if reply["id"] != id {
                continue;
            }
            assert!(reply.get("error").is_none(), "{method}: {reply}");
            return reply["result"].clone();
        }
    }

    /// Evaluates `expression` in the page; returns its value (which must
    /// be JSON-serializable).
    pub fn evaluate(&mut self, expression: &str) -> Value {
        let result = self.call(
            "Runtime.evaluate",
            json!({"expression": expression, "returnByValue": true}),
        );
        assert!(
            result.get("exceptionDetails").is_none(),
            "evaluation failed: {result}"
        );
        result["result"]["value"].clone()
    }

    /// Evaluates `expression` until its value satisfies `ready`; fails,
    /// showing the last value, after [`DEADLINE`]. `between` runs before
    /// every evaluation.
    pub fn wait_until(
        &mut self,
        what: &str,
        expression: &str,
        mut between: impl FnMut(),
        mut ready: impl FnMut(&Value) -> bool,
    ) -> Value {
        let deadline = Instant::now() + DEADLINE;
        loop {
            between();
            let value = self.evaluate(expression);
            if ready(&value) {
                return value;
            }
            assert!(
                Instant::now() < deadline,
                "the page never showed {what}: {value}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // Asked to close, Chromium ends and reaps its own helpers; dropping
        // `process` next kills whatever is left.
        let close = json!({"id": 0, "method": "Browser.close"}).to_string();
        if self.devtools.send(Message::text(close)).is_ok() {
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline && matches!(self.process.child.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

/// Waits for Chromium to write its DevTools port and connects to it.
fn connect_devtools(profile: &std::path::Path, dir: &std::path::Path) -> Ws {
    let deadline = Instant::now() + DEADLINE;
    let port_file = profile.join("DevToolsActivePort");
    loop {
        // Two lines, the port and the browser's WebSocket path, written
        // once DevTools listens; a partly written file is read again.
        if let Ok(text) = std::fs::read_to_string(&port_file) {
            if let Some((port, path)) = text.split_once('\n') {
                let url = format!("ws://127.0.0.1:{port}{}", path.trim());
                let (devtools, _) = tungstenite::connect(url).expect("connect to DevTools");
                super::set_timeout(&devtools, DEADLINE);
                return devtools;
            }
        }
        let log = || std::fs::read_to_string(dir.join("chromium.log")).unwrap_or_default();
        assert!(
            Instant::now() < deadline,
            "chromium never opened DevTools; its log:\n{}",
            log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
