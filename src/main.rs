//! The `weir` binary: `weir` or `weir serve` starts the server; `weir checkpoint` asks a
//! running server for a checkpoint.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;

use weir::config::Config;
use weir::db::Database;

/// The server's allocator. jemalloc returns freed memory to the system within a second (its
/// background thread purges idle arenas), where glibc's malloc kept the peak of a burst (a
/// bulk load, a large statement) resident.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options (a C string it reads at its start): purge freed pages after a second,
/// from a background thread, so that an idle server shrinks too.
#[allow(non_upper_case_globals)]
#[export_name = "malloc_conf"]
pub static malloc_conf: Option<&'static u8> = Some(&MALLOC_CONF[0]);

const MALLOC_CONF: &[u8] = b"background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0\0";

#[derive(Parser)]
#[command(
    name = "weir",
    version,
    about = "A streaming SQL database with incremental materialized views"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    serve: ServeArgs,
}

#[derive(Subcommand)]
enum Command {
    /// Start the server (the default).
    Serve(ServeArgs),
    /// Take a checkpoint on a running server; prints its id once it is complete.
    Checkpoint(CheckpointArgs),
    /// Print a Nexmark stream's events as newline-delimited JSON (for a Kafka topic or a
    /// file): those a `connector = 'nexmark'` source with the same stream and events reads.
    Nexmark(NexmarkArgs),
}

#[derive(clap::Args)]
struct NexmarkArgs {
    /// person, auction or bid.
    #[arg(long)]
    stream: String,
    /// Events of the whole sequence (46 of every 50 are bids, 3 auctions, 1 a person).
    #[arg(long)]
    events: u64,
}

#[derive(clap::Args)]
struct CheckpointArgs {
    /// The server's SQL address.
    #[arg(long, default_value = "127.0.0.1:4466")]
    server: std::net::SocketAddr,
}

#[derive(clap::Args, Clone, Default)]
struct ServeArgs {
    /// Address for SQL clients (default 127.0.0.1:4466).
    #[arg(long)]
    listen: Option<std::net::SocketAddr>,
    /// Directory for the catalog, change logs and state (default ./weir-data).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// TOML file with settings; flags override it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Refused: clients authenticate by the config's `[[auth]]` rules.
    #[arg(long, hide = true)]
    trust_remote_clients: bool,
    /// Parallel actors per keyed operator of a view (default: the number of cores).
    #[arg(long)]
    streaming_parallelism: Option<usize>,
    /// Address of the admin HTTP port: checkpoint triggers and /metrics (default: off).
    #[arg(long)]
    admin_listen: Option<std::net::SocketAddr>,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = Cli::parse();
    let (args, checkpoint) = match cli.command {
        Some(Command::Serve(a)) => (a, None),
        Some(Command::Checkpoint(c)) => (cli.serve, Some(c)),
        Some(Command::Nexmark(n)) => return nexmark_json(&n),
        None => (cli.serve, None),
    };
    let runtime = match weir::runtime() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("weir: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = match checkpoint {
        Some(c) => runtime.block_on(request_checkpoint(c)),
        // On a runtime thread, not this one: every statement (views started at start
        // included) runs with the stack it was sized for.
        None => runtime.block_on(async {
            tokio::spawn(serve(args))
                .await
                .unwrap_or_else(|e| Err(weir::error::Error::internal(format!("server task: {e}"))))
        }),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            if let Some(hint) = &e.hint {
                eprintln!("hint: {hint}");
            }
            ExitCode::FAILURE
        }
    }
}

async fn serve(args: ServeArgs) -> weir::error::Result<()> {
    let mut config = match &args.config {
        Some(path) => Config::from_file(path)?,
        None => Config::default(),
    };
    if let Some(l) = args.listen {
        config.listen = l;
    }
    if let Some(d) = args.data_dir {
        config.data_dir = d;
    }
    if let Some(n) = args.streaming_parallelism {
        config.streaming_parallelism = n;
    }
    if let Some(a) = args.admin_listen {
        config.admin_listen = Some(a);
    }
    weir::db::parse_parallelism(&config.streaming_parallelism.to_string())?;
    if let Some((before, after)) = weir::raise_open_files_limit() {
        if after > before {
            tracing::info!("open file limit raised from {before} to {after}");
        }
    }
    if args.trust_remote_clients {
        return Err(weir::config::trust_remote_clients_gone());
    }
    // The bootstrap superuser's password, for the first start: the environment's when the
    // config file gives none.
    if config.superuser_password.is_none() {
        config.superuser_password = std::env::var("WEIR_SUPERUSER_PASSWORD").ok();
    }
    // The key of secrets, and those it replaced: the environment's when the file gives none.
    if config.secret_key.is_none() {
        config.secret_key = std::env::var("WEIR_SECRET_KEY").ok();
    }
    if config.secret_keys_previous.is_empty() {
        if let Ok(keys) = std::env::var("WEIR_SECRET_KEYS_PREVIOUS") {
            config.secret_keys_previous = (keys.split(',').map(str::trim))
                .filter(|k| !k.is_empty())
                .map(String::from)
                .collect();
        }
    }
    config.check()?;
    let tls = weir::server::Tls::load(config.tls.as_ref())?;
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|e| {
            weir::error::Error::unavailable(format!("cannot listen on {}: {e}", config.listen))
        })?;
    let addr = listener.local_addr()?;
    // The address as bound (a port of 0 is the one the system chose): the data directory's
    // lock and the checkpoint store's generation name it.
    config.listen = addr;
    let admin = match config.admin_listen {
        Some(a) => Some(tokio::net::TcpListener::bind(a).await.map_err(|e| {
            weir::error::Error::unavailable(format!("cannot listen on {a} (admin): {e}"))
        })?),
        None => None,
    };
    let db = Database::open(config.clone()).await?;
    if let Some(admin) = admin {
        tracing::info!("admin HTTP port on {}", admin.local_addr()?);
        tokio::spawn(weir::admin::serve(
            db.clone(),
            admin,
            tls.clone(),
            std::future::pending(),
        ));
    }
    tracing::info!(
        "weir is ready: connect with psql -h {} -p {} -U {} -d {}",
        addr.ip(),
        addr.port(),
        weir::catalog::BOOTSTRAP_ROLE,
        weir::DATABASE_NAME
    );
    weir::server::serve(db, listener, tls, shutdown_signal()).await;
    tracing::info!("weir shut down");
    Ok(())
}

/// `weir nexmark`: the stream's events on standard output.
fn nexmark_json(args: &NexmarkArgs) -> ExitCode {
    let out = std::io::BufWriter::new(std::io::stdout().lock());
    match weir::connector::source::nexmark_json(&args.stream.to_lowercase(), args.events, out) {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("weir: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `weir checkpoint`: runs `CHECKPOINT` on the server and prints the checkpoint's id.
/// Connects as PGUSER (default `weir`) with PGPASSWORD, when set.
async fn request_checkpoint(args: CheckpointArgs) -> weir::error::Result<()> {
    // As libpq's clients: the role and password from PGUSER and PGPASSWORD when set.
    let mut config = tokio_postgres::Config::new();
    config
        .host(args.server.ip().to_string())
        .port(args.server.port())
        .dbname(weir::DATABASE_NAME)
        .user(std::env::var("PGUSER").unwrap_or_else(|_| weir::catalog::BOOTSTRAP_ROLE.into()));
    if let Ok(password) = std::env::var("PGPASSWORD") {
        config.password(password);
    }
    let unavailable = |e: tokio_postgres::Error| {
        weir::error::Error::unavailable(format!("checkpoint on {}: {e}", args.server))
    };
    let (client, connection) = config
        .connect(tokio_postgres::NoTls)
        .await
        .map_err(unavailable)?;
    tokio::spawn(connection);
    let row = client
        .query_one("CHECKPOINT", &[])
        .await
        .map_err(unavailable)?;
    let (id, epoch): (i64, i64) = (row.get("id"), row.get("epoch"));
    println!("checkpoint {id} complete (epoch {epoch})");
    Ok(())
}

/// Completes on SIGTERM or Ctrl-C.
async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}
