//! A Kafka-protocol broker for tests: tansu (`scripts/deps --test-tools` builds it into
//! `~/.cache/weir/tools`, or `WEIR_TANSU` names one), on a free loopback port, with its memory
//! engine or another (its S3 engine, whose topics outlive the process); killed on drop. The
//! crash test and `tests/kafka.rs` share it.

use std::path::PathBuf;
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::FutureProducer;
use rdkafka::ClientConfig;

pub struct Broker {
    child: Option<std::process::Child>,
    pub address: String,
    storage: String,
    env: Vec<(String, String)>,
}

impl Broker {
    pub fn start() -> Result<Broker, String> {
        Broker::start_on("memory://tansu/", Vec::new())
    }

    /// A broker whose topics are kept by `storage`, configured by `env`.
    pub fn start_on(storage: &str, env: Vec<(String, String)>) -> Result<Broker, String> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("finding a free port: {e}"))?
            .port();
        let mut broker = Broker {
            child: None,
            address: format!("127.0.0.1:{port}"),
            storage: storage.to_string(),
            env,
        };
        broker.restart()?;
        Ok(broker)
    }

    /// Starts the broker again (on the same port), after `stop`.
    pub fn restart(&mut self) -> Result<(), String> {
        let bin = match std::env::var_os("WEIR_TANSU") {
            Some(b) => PathBuf::from(b),
            None => PathBuf::from(std::env::var_os("HOME").ok_or("HOME is not set")?)
                .join(".cache/weir/tools/tansu-0.6.0/bin/tansu"),
        };
        if !bin.exists() {
            return Err(format!(
                "no Kafka broker at {}: run scripts/deps --test-tools, which builds tansu there",
                bin.display()
            ));
        }
        let url = format!("tcp://{}", self.address);
        let mut child = std::process::Command::new(bin)
            .args([
                "broker",
                "--storage-engine",
                &self.storage,
                "--kafka-listener-url",
                &url,
                "--kafka-advertised-listener-url",
                &url,
            ])
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .map_err(|e| format!("starting tansu: {e}"))?;
        for _ in 0..500 {
            if std::net::TcpStream::connect(&self.address).is_ok() {
                self.child = Some(child);
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
        Err(format!(
            "tansu did not listen on {} within 5 s",
            self.address
        ))
    }

    /// Kills the broker.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub async fn create_topic(&self, name: &str, partitions: i32) -> Result<(), String> {
        let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", &self.address)
            .create()
            .map_err(|e| e.to_string())?;
        let topic = NewTopic::new(name, partitions, TopicReplication::Fixed(1));
        let created = admin
            .create_topics(&[topic], &AdminOptions::new())
            .await
            .map_err(|e| e.to_string())?;
        for r in created {
            r.map_err(|(t, e)| format!("creating topic {t}: {e}"))?;
        }
        Ok(())
    }

    /// An idempotent producer (a message the broker acknowledged is there once) that writes
    /// each message as a record batch of its own: tansu 0.6.0 answers a fetch from an offset
    /// inside a batch with the batches after it (its dynostore's `fetch` lists batches from
    /// the offset on), so that a consumer resuming there would lose the rest of that batch
    /// and read later ones again. Apache Kafka sends the whole batch and the client skips the
    /// offsets before its own.
    pub fn producer(&self) -> Result<FutureProducer, String> {
        ClientConfig::new()
            .set("bootstrap.servers", &self.address)
            .set("enable.idempotence", "true")
            .set("batch.num.messages", "1")
            .create()
            .map_err(|e| e.to_string())
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        self.stop();
    }
}
