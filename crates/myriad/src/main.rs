//! The `myriad` command: `serve` runs a node, `doctor` checks the host
//! against what that node is set up to hold, `sub` and `pub` are a tiny
//! client for trying it, `token` mints a connection token for it, `graph`
//! builds follow graphs, and `bench` drives the load tools.

mod client;
mod graph;
mod sub;
mod token;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use myriad_protocol::message::{encode_publish, parse_server_message, ServerMessage};
use myriad_server::Config;

use crate::client::{Client, ClientError};

#[derive(Parser)]
#[command(
    name = "myriad",
    version,
    about = "A real-time publish/subscribe server for the web"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a node (no configuration needed; see docs/operations.md).
    Serve(Box<ServeArgs>),
    /// Check this host's limits against a node's settings: open files,
    /// accept queues, kernel memory, ports, conntrack, paging. Exits 1
    /// when a check fails.
    Doctor(Box<DoctorArgs>),
    /// Subscribe to subjects and print every delivery as a JSON line.
    Sub(SubArgs),
    /// Publish one message over WebSocket.
    Pub(PubArgs),
    /// Load tools: connect-rate, subscribers, publishers, broadcast, run,
    /// churn, social; subscribers over WebSocket, SSE, HTTP streaming or
    /// long-poll.
    Bench(Box<myriad_bench::BenchCommand>),
    /// The follow graph: generate seed 004's dataset, load, stats, probe.
    Graph(graph::GraphArgs),
    /// Mint a connection token (JWT) for a node that checks tokens.
    Token(token::TokenArgs),
}

#[derive(Args)]
struct ServeArgs {
    /// TOML file with settings (flags and MYRIAD_* variables override it).
    #[arg(long, env = "MYRIAD_CONFIG")]
    config: Option<PathBuf>,
    /// Declares the settings' flags; `Config::assemble` reads them back from
    /// the matches, where it can also see which ones were given explicitly.
    #[command(flatten)]
    _settings: Config,
}

#[derive(Args)]
struct DoctorArgs {
    /// Connections to check for; the node's max_connections by default.
    #[arg(long)]
    connections: Option<u64>,
    /// Print one JSON document instead of the table.
    #[arg(long)]
    json: bool,
    /// TOML file with settings, read as `serve` reads it.
    #[arg(long, env = "MYRIAD_CONFIG")]
    config: Option<PathBuf>,
    /// The systemd service that runs the node (e.g. myriad.service), whose
    /// LimitNOFILE is checked; the one the doctor runs in by default.
    #[arg(long)]
    unit: Option<String>,
    /// Client connections every node on this host holds in all, for the
    /// rows of limits the box shares (fs.file-max, tcp_mem, memory,
    /// conntrack); --connections by default.
    #[arg(long)]
    host_connections: Option<u64>,
    /// The clients run on this host too: each connection is two files
    /// here, and the port row counts their ephemeral ports.
    #[arg(long)]
    loopback: bool,
    /// Source addresses the clients here connect from (with --loopback).
    #[arg(
        long,
        default_value_t = 1,
        requires = "loopback",
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    sources: u64,
    /// Files the deployment's other processes on this host keep besides
    /// their connections (other nodes' own share, load generators, Redis).
    #[arg(long, default_value_t = 0)]
    extra_files: u64,
    /// Bytes of userland memory the deployment's other processes on this
    /// host take (load generators, Redis).
    #[arg(long, default_value_t = 0)]
    extra_memory: u64,
    /// TCP bytes one connection queues at the peak, against tcp_mem; the
    /// kernel cost of an idle loopback pair by default.
    #[arg(long)]
    queued_bytes: Option<u64>,
    /// Judge memory against MemAvailable (what running processes leave
    /// now) instead of MemTotal: for a run about to start beside them.
    #[arg(long)]
    memory_available: bool,
    /// The same settings as `serve`, so the doctor sees the node's sizes.
    #[command(flatten)]
    _settings: Config,
}

#[derive(Args)]
struct SubArgs {
    /// Subjects to subscribe to.
    #[arg(required = true)]
    subjects: Vec<String>,
    /// The node's WebSocket endpoint. Give several (repeat --url, or
    /// separate them with commas), nodes of one cluster, to fail over: when
    /// the connection drops, the next one is tried, round robin.
    #[arg(
        long = "url",
        value_delimiter = ',',
        default_value = "ws://127.0.0.1:8080/ws"
    )]
    url: Vec<String>,
    /// Exit after this many deliveries.
    #[arg(long)]
    count: Option<u64>,
    /// Most connection tries per outage (the first at once, then 100 ms
    /// apart doubling to 2 s) before giving up.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..))]
    attempts: u32,
}

#[derive(Args)]
struct PubArgs {
    subject: String,
    /// JSON value, or any text (sent as a JSON string).
    data: String,
    #[arg(long, default_value = "ws://127.0.0.1:8080/ws")]
    url: String,
}

fn main() -> ExitCode {
    let matches = Cli::command().get_matches();
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    match cli.command {
        Command::Serve(args) => {
            let serve_matches = matches
                .subcommand_matches("serve")
                .expect("clap matched serve");
            serve(args.config, serve_matches)
        }
        Command::Doctor(args) => {
            let doctor_matches = matches
                .subcommand_matches("doctor")
                .expect("clap matched doctor");
            doctor(&args, doctor_matches)
        }
        Command::Sub(args) => report(subscribe(args)),
        Command::Pub(args) => report(publish(args)),
        Command::Bench(cmd) => myriad_bench::run(*cmd),
        Command::Graph(args) => report(graph::run(args)),
        Command::Token(args) => report(token::run(args)),
    }
}

fn serve(file: Option<PathBuf>, matches: &clap::ArgMatches) -> ExitCode {
    let config = match Config::assemble(matches, file.as_deref()) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("myriad: {e}");
            return ExitCode::from(2);
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_new(&config.log)
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    match myriad_server::serve(config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            eprintln!("myriad: {e}");
            ExitCode::FAILURE
        }
    }
}

fn doctor(args: &DoctorArgs, matches: &clap::ArgMatches) -> ExitCode {
    use myriad_server::doctor::{examine, real_host, Target};
    let config = match Config::assemble(matches, args.config.as_deref()) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("myriad: {e}");
            return ExitCode::from(2);
        }
    };
    let mut target = Target::from_config(&config, args.connections);
    let host = &mut target.host;
    host.connections = args.host_connections.unwrap_or(target.connections);
    if host.connections < target.connections {
        eprintln!("myriad: --host-connections is less than this node's --connections");
        return ExitCode::from(2);
    }
    host.loopback = args.loopback;
    host.sources = args.sources;
    host.extra_files = args.extra_files;
    host.extra_memory = args.extra_memory;
    host.queued_bytes = args.queued_bytes.unwrap_or(host.queued_bytes);
    host.memory_available = args.memory_available;
    let report = examine(&real_host(args.unit.as_deref()), &target);
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).expect("a report serializes")
        );
    } else {
        print!("{}", report.to_text());
    }
    if report.failed().next().is_some() {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

fn report(result: Result<(), impl std::fmt::Display>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("myriad: {e}");
            ExitCode::FAILURE
        }
    }
}

fn subscribe(args: SubArgs) -> Result<(), ClientError> {
    let mut sub = sub::Subscriber::new(args.url, args.subjects, args.count, args.attempts);
    sub.run()
}

fn publish(args: PubArgs) -> Result<(), ClientError> {
    let data = if serde_json::from_str::<serde_json::Value>(&args.data).is_ok() {
        args.data
    } else {
        serde_json::Value::String(args.data).to_string()
    };
    let mut client = Client::connect(&args.url)?;
    client.send_text(&encode_publish(&args.subject, &data, Some(1)))?;
    loop {
        let text = client.next_text()?;
        match parse_server_message(&text) {
            Ok(ServerMessage::Ok { id: Some(1), .. }) => {
                client.close()?;
                return Ok(());
            }
            Ok(ServerMessage::Error { code, message, .. }) => {
                return Err(ClientError::Refused {
                    code: code.into_owned(),
                    message: message.into_owned(),
                });
            }
            _ => {}
        }
    }
}
