//! Lifecycle webhooks against the real binary (issue 29). So far: the
//! hook settings a node cannot deliver with stop its start, with a message
//! naming the setting; delivery to a real receiver comes with the slices
//! that feed and send the queue.

mod common;

use common::refused_start;

const SECRET: &str = "0123456789abcdef0123456789abcdef";

#[test]
fn a_hook_url_that_is_not_http_stops_the_start_naming_it() {
    for url in ["ftp://127.0.0.1/hooks", "127.0.0.1:9/hooks", "http://"] {
        let args = ["--hook-url", url, "--hook-secret", SECRET];
        let (code, stderr) = refused_start(&args, &[]);
        assert_eq!(code, 2, "{url}: {stderr}");
        assert!(stderr.contains("hook_url"), "{url}: {stderr}");
    }
}

#[test]
fn a_short_or_missing_hook_secret_stops_the_start_naming_it() {
    let url = "http://127.0.0.1:9/hooks";
    let short = &SECRET[..31];
    let (code, stderr) = refused_start(&["--hook-url", url, "--hook-secret", short], &[]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("hook_secret is 31 bytes"), "{stderr}");
    let (code, stderr) = refused_start(&["--hook-url", url], &[]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("hook_url needs hook_secret"), "{stderr}");
    // The secret never reaches the log.
    let args = ["--hook-url", "ftp://x/", "--hook-secret", SECRET];
    let (_, stderr) = refused_start(&args, &[]);
    assert!(!stderr.contains(SECRET), "{stderr}");
}

#[test]
fn an_unknown_hook_event_stops_the_start_naming_it() {
    let args = [
        "--hook-url",
        "https://127.0.0.1:9/hooks",
        "--hook-secret",
        SECRET,
        "--hook-events",
        "online,gone",
    ];
    let (code, stderr) = refused_start(&args, &[]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("hook_events: unknown event \"gone\""),
        "{stderr}"
    );
}
