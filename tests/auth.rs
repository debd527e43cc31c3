//! Roles and authentication (`docs/design/0019-authentication.md`): SCRAM-SHA-256 against
//! verifiers kept in the catalog, the bootstrap superuser trusted from loopback until it has
//! a password, `[[auth]]` rules choosing the method by address and user as pg_hba.conf does,
//! and each refusal with PostgreSQL's SQLSTATE; TLS asked for by SSLRequest or begun at once
//! (PostgreSQL 17's direct negotiation), and required.

mod common;

use common::TestServer;
use weir::config::{AuthMethod, AuthRule};

/// A connection as `user` with `password` (none: the field is left out), or the server's
/// error as `SQLSTATE message`.
async fn login(
    server: &TestServer,
    user: &str,
    password: Option<&str>,
) -> Result<tokio_postgres::Client, String> {
    let mut conn = format!(
        "host=127.0.0.1 port={} user={user} dbname=weir",
        server.addr.port()
    );
    if let Some(p) = password {
        let quoted = p.replace('\\', "\\\\").replace('\'', "\\'");
        conn.push_str(&format!(" password='{quoted}'"));
    }
    match tokio_postgres::connect(&conn, tokio_postgres::NoTls).await {
        Ok((client, connection)) => {
            tokio::spawn(connection);
            Ok(client)
        }
        Err(e) => Err(error(&e)),
    }
}

fn error(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} {}", db.code().code(), db.message()),
        None => e.to_string(),
    }
}

/// The SQLSTATE and message of `sql`'s error, or `ok`.
async fn outcome(client: &tokio_postgres::Client, sql: &str) -> String {
    match client.batch_execute(sql).await {
        Ok(()) => "ok".into(),
        Err(e) => error(&e),
    }
}

async fn one(client: &tokio_postgres::Client, sql: &str) -> String {
    common::text_rows(client, sql).await.join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bootstrap_superuser_is_trusted_from_loopback_until_it_has_a_password() {
    let server = TestServer::start().await;
    let weir = login(&server, "weir", None).await.unwrap();
    assert_eq!(
        one(&weir, "SELECT current_user, rolsuper FROM pg_roles").await,
        "weir t"
    );
    assert_eq!(
        outcome(&weir, "ALTER USER weir PASSWORD 'Root pw 1'").await,
        "ok"
    );
    // From now on it proves who it is, with SCRAM.
    assert_eq!(
        login(&server, "weir", Some("wrong")).await.err().unwrap(),
        "28P01 password authentication failed for user \"weir\""
    );
    let again = login(&server, "weir", Some("Root pw 1")).await.unwrap();
    assert_eq!(one(&again, "SELECT session_user").await, "weir");
    // Without a password it is trusted again.
    assert_eq!(outcome(&again, "ALTER ROLE weir PASSWORD NULL").await, "ok");
    login(&server, "weir", None).await.unwrap();
    // The bootstrap superuser keeps what it needs, and cannot go.
    assert_eq!(
        outcome(&again, "ALTER ROLE weir NOSUPERUSER").await,
        "42501 permission denied to alter role \"weir\""
    );
    assert_eq!(
        outcome(&again, "DROP ROLE weir").await,
        "55006 current user cannot be dropped"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roles_log_in_with_scram_and_every_other_login_is_refused() {
    let server = TestServer::start().await;
    let weir = login(&server, "weir", None).await.unwrap();
    let password = "s3cret-Ünïcode";
    assert_eq!(
        outcome(
            &weir,
            &format!("CREATE USER app WITH PASSWORD '{password}' CONNECTION LIMIT 1")
        )
        .await,
        "ok"
    );
    assert_eq!(outcome(&weir, "CREATE ROLE quiet PASSWORD 'x'").await, "ok");
    let app = login(&server, "app", Some(password)).await.unwrap();
    assert_eq!(
        one(
            &app,
            "SELECT current_user, session_user, pg_backend_pid() > 0"
        )
        .await,
        "app app t"
    );
    // Its second connection passes its limit; a wrong password, a role that does not exist
    // and a role that may not log in are refused as PostgreSQL refuses them.
    assert_eq!(
        login(&server, "app", Some(password)).await.err().unwrap(),
        "53300 too many connections for role \"app\""
    );
    for (user, password, expected) in [
        (
            "app",
            "s3cret",
            "28P01 password authentication failed for user \"app\"",
        ),
        (
            "nobody",
            "x",
            "28P01 password authentication failed for user \"nobody\"",
        ),
        (
            "quiet",
            "x",
            "28000 role \"quiet\" is not permitted to log in",
        ),
    ] {
        assert_eq!(
            login(&server, user, Some(password)).await.err().unwrap(),
            expected
        );
    }
    // The password is kept only as a verifier: not in the catalog's file, not in pg_roles.
    let catalog = std::fs::read_to_string(server.dir.path().join("catalog.json")).unwrap();
    assert!(catalog.contains("SCRAM-SHA-256$4096:"), "{catalog}");
    assert!(!catalog.contains("s3cret"));
    assert_eq!(
        one(
            &weir,
            "SELECT rolname, rolcanlogin, rolconnlimit, rolpassword FROM pg_roles ORDER BY oid"
        )
        .await,
        "weir t -1 ********\napp t 1 ********\nquiet f -1 ********"
    );
    assert_eq!(
        one(&weir, "SELECT usename FROM pg_user ORDER BY usesysid").await,
        "weir\napp"
    );
    // What a role may do to roles: its own password, nothing else without CREATEROLE.
    assert_eq!(outcome(&app, "ALTER USER app PASSWORD 'next'").await, "ok");
    for (sql, expected) in [
        ("CREATE ROLE x", "42501 permission denied to create role"),
        (
            "ALTER ROLE quiet LOGIN",
            "42501 permission denied to alter role",
        ),
        (
            "ALTER ROLE weir PASSWORD 'mine'",
            "42501 permission denied to alter role",
        ),
        ("DROP ROLE quiet", "42501 permission denied to drop role"),
    ] {
        assert_eq!(outcome(&app, sql).await, expected, "{sql}");
    }
    // Its one allowed session ends when the client closes; the server counts it until then.
    drop(app);
    while one(
        &weir,
        "SELECT count(*) FROM pg_stat_activity WHERE usename = 'app'",
    )
    .await
        != "0"
    {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    login(&server, "app", Some("next")).await.unwrap();
    // What a superuser is told.
    for (sql, expected) in [
        ("CREATE ROLE app", "42710 role \"app\" already exists"),
        (
            "CREATE ROLE pg_monitor2",
            "42939 role name \"pg_monitor2\" is reserved",
        ),
        ("DROP ROLE nobody", "42704 role \"nobody\" does not exist"),
        ("DROP ROLE IF EXISTS nobody", "ok"),
        (
            "BEGIN; CREATE ROLE b",
            "25001 CREATE ROLE cannot run inside a transaction block",
        ),
        ("ROLLBACK", "ok"),
        ("ALTER ROLE quiet CREATEROLE LOGIN", "ok"),
    ] {
        assert_eq!(outcome(&weir, sql).await, expected, "{sql}");
    }
    // A role with CREATEROLE manages roles that are not superusers.
    let quiet = login(&server, "quiet", Some("x")).await.unwrap();
    for (sql, expected) in [
        ("CREATE ROLE helper LOGIN PASSWORD 'h'", "ok"),
        (
            "CREATE ROLE boss SUPERUSER",
            "42501 permission denied to create role",
        ),
        (
            "ALTER ROLE weir PASSWORD 'p'",
            "42501 permission denied to alter role",
        ),
        ("DROP ROLE helper", "ok"),
    ] {
        assert_eq!(outcome(&quiet, sql).await, expected, "{sql}");
    }
    // Roles, with their passwords, come back with the catalog after a restart.
    drop((weir, quiet));
    let dir = server.stop_and_close().await;
    let server = TestServer::start_in(dir, |_| {}).await;
    login(&server, "app", Some("next")).await.unwrap();
    assert_eq!(
        login(&server, "app", Some(password)).await.err().unwrap(),
        "28P01 password authentication failed for user \"app\""
    );
}

fn rule(address: &str, user: &str, method: AuthMethod) -> AuthRule {
    AuthRule {
        address: address.into(),
        user: user.into(),
        method,
        tls: None,
        while_passwordless: false,
    }
}

/// A connection from the loopback address `from` (not 127.0.0.1: a rule can tell them apart).
async fn login_from(
    server: &TestServer,
    from: &str,
    user: &str,
    password: &str,
) -> Result<tokio_postgres::Client, String> {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(format!("{from}:0").parse().unwrap()).unwrap();
    let stream = socket.connect(server.addr).await.unwrap();
    login_over(stream, user, password).await
}

/// A login as `user` with `password` over a connection already made, or the server's error
/// as `SQLSTATE message`.
async fn login_over<S>(
    stream: S,
    user: &str,
    password: &str,
) -> Result<tokio_postgres::Client, String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let mut config = tokio_postgres::Config::new();
    config.user(user).password(password).dbname("weir");
    match config.connect_raw(stream, tokio_postgres::NoTls).await {
        Ok((client, connection)) => {
            tokio::spawn(connection);
            Ok(client)
        }
        Err(e) => Err(error(&e)),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_choose_each_client_s_method_by_address_and_user() {
    let rules = vec![
        rule("127.0.0.1", "weir", AuthMethod::Trust),
        rule("127.0.0.2/32", "app", AuthMethod::Password),
        rule("127.0.0.1/32", "app", AuthMethod::Md5),
        rule("127.0.0.0/8", "app", AuthMethod::ScramSha256),
        rule("all", "shut", AuthMethod::Reject),
        rule("127.0.0.1", "all", AuthMethod::ScramSha256),
    ];
    let server = TestServer::start_with(|c| {
        c.auth = rules;
        c.superuser_password = Some("boot pw".into());
    })
    .await;
    // Trusted by its rule, whatever its password.
    let weir = login(&server, "weir", None).await.unwrap();
    weir.batch_execute("CREATE USER app PASSWORD 'app pw'; CREATE USER shut PASSWORD 'pw'")
        .await
        .unwrap();
    // The clear-text password from 127.0.0.2, md5 (SCRAM, since passwords are verifiers)
    // from 127.0.0.1, SCRAM from the rest of 127/8.
    for from in ["127.0.0.2", "127.0.0.1", "127.0.0.3"] {
        let app = login_from(&server, from, "app", "app pw").await.unwrap();
        assert_eq!(one(&app, "SELECT current_user").await, "app", "{from}");
        assert_eq!(
            login_from(&server, from, "app", "bad").await.err().unwrap(),
            "28P01 password authentication failed for user \"app\"",
            "{from}"
        );
    }
    assert_eq!(
        login(&server, "shut", Some("pw")).await.err().unwrap(),
        "28000 pg_hba.conf rejects connection for host \"127.0.0.1\", user \"shut\", database \"weir\", no encryption"
    );
    // No rule covers another user from 127.0.0.2.
    assert_eq!(
        login_from(&server, "127.0.0.2", "weir", "boot pw")
            .await
            .err()
            .unwrap(),
        "28000 no pg_hba.conf entry for host \"127.0.0.2\", user \"weir\", database \"weir\", no encryption"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_superuser_password_of_the_config_is_set_by_the_first_start_only() {
    let server = TestServer::start_with(|c| c.superuser_password = Some("first".into())).await;
    assert_eq!(
        login(&server, "weir", Some("other")).await.err().unwrap(),
        "28P01 password authentication failed for user \"weir\""
    );
    drop(login(&server, "weir", Some("first")).await.unwrap());
    let dir = server.stop_and_close().await;
    let server = TestServer::start_in(dir, |c| c.superuser_password = Some("second".into())).await;
    login(&server, "weir", Some("first")).await.unwrap();
    assert!(login(&server, "weir", Some("second")).await.is_err());
}

#[test]
fn a_start_that_trusts_remote_clients_is_refused_with_the_rule_that_replaces_it() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_weir"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--trust-remote-clients",
            "--data-dir",
        ])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(
        log.contains("trust_remote_clients is no longer supported"),
        "{log}"
    );
    assert!(log.contains("method = \"scram-sha-256\""), "{log}");
}

/// A TLS client trusting only `cert`, naming the ALPN protocol `alpn` (none if empty).
fn tls_client(cert: &std::path::Path, alpn: &[u8]) -> tokio_rustls::TlsConnector {
    use tokio_rustls::rustls;
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(rustls::pki_types::CertificateDer::from_pem_file(cert).unwrap())
        .unwrap();
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    if !alpn.is_empty() {
        config.alpn_protocols = vec![alpn.to_vec()];
    }
    tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
}

/// How a test client begins TLS.
#[derive(Clone, Copy)]
enum Negotiation {
    /// An SSLRequest, then the handshake once the server says `S`.
    Request,
    /// The handshake at once (`sslnegotiation=direct`), with or without ALPN.
    Direct { alpn: bool },
}

/// A connection over TLS as `user`, or the server's error as `SQLSTATE message`.
async fn login_tls(
    server: &TestServer,
    cert: &std::path::Path,
    negotiation: Negotiation,
    user: &str,
    password: &str,
) -> Result<tokio_postgres::Client, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let alpn = match negotiation {
        Negotiation::Request => {
            tcp.write_all(&[0, 0, 0, 8, 4, 210, 22, 47]).await.unwrap();
            assert_eq!(tcp.read_u8().await.unwrap(), b'S');
            true
        }
        Negotiation::Direct { alpn } => alpn,
    };
    let name = tokio_rustls::rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let protocol: &[u8] = if alpn { b"postgresql" } else { b"" };
    let stream = tls_client(cert, protocol).connect(name, tcp).await.unwrap();
    login_over(stream, user, password).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_is_begun_by_request_or_at_once_and_can_be_required() {
    let certs = tempfile::tempdir().unwrap();
    let [ca, cert, key] = common::certificate(certs.path());
    let tls = |require| weir::config::TlsConfig {
        cert: cert.clone(),
        key: key.clone(),
        require,
    };
    let server = TestServer::start_with(|c| {
        c.tls = Some(tls(false));
        // hostssl: `app` may log in over TLS only.
        c.auth = vec![
            rule("loopback", "weir", AuthMethod::Trust),
            AuthRule {
                tls: Some(true),
                ..rule("loopback", "app", AuthMethod::ScramSha256)
            },
        ];
    })
    .await;
    let weir = server.connect().await;
    outcome(&weir, "CREATE ROLE app LOGIN PASSWORD 'pw'").await;
    for negotiation in [Negotiation::Request, Negotiation::Direct { alpn: true }] {
        let app = login_tls(&server, &ca, negotiation, "app", "pw")
            .await
            .unwrap();
        assert_eq!(one(&app, "SELECT current_user").await, "app");
    }
    // Direct TLS must name the protocol, as PostgreSQL 17 requires.
    assert_eq!(
        login_tls(
            &server,
            &ca,
            Negotiation::Direct { alpn: false },
            "app",
            "pw"
        )
        .await
        .err()
        .unwrap(),
        "08P01 received direct SSL connection request without ALPN protocol negotiation extension"
    );
    // The hostssl rule does not cover a plaintext connection.
    assert_eq!(
        login(&server, "app", Some("pw")).await.err().unwrap(),
        "28000 no pg_hba.conf entry for host \"127.0.0.1\", user \"app\", database \"weir\", \
         no encryption"
    );
    // libpq checks the certificate against the host's name and the root it is given, and
    // binds SCRAM to it (SCRAM-SHA-256-PLUS: it refuses to go on if the server offers none).
    let conninfo = std::process::Command::new("psql")
        .arg(format!(
            "host=localhost port={} user=app dbname=weir sslmode=verify-full sslrootcert={} \
             channel_binding=require",
            server.addr.port(),
            ca.display()
        ))
        .args(["-X", "-c", "\\conninfo", "-c", "SELECT current_user"])
        .env("PGPASSWORD", "pw")
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&conninfo.stdout);
    assert!(conninfo.status.success(), "{conninfo:?}");
    assert!(out.contains("SSL connection (protocol: TLSv1.3"), "{out}");
    // Bytes sent after the SSLRequest, before the handshake, end the connection.
    {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut tcp = tokio::net::TcpStream::connect(server.addr).await.unwrap();
        tcp.write_all(&[0, 0, 0, 8, 4, 210, 22, 47, 0, 0, 0, 8])
            .await
            .unwrap();
        let mut answer = Vec::new();
        tcp.read_to_end(&mut answer).await.unwrap();
        assert_eq!(answer, b"S");
    }
    drop((weir, server));

    // Required: no plaintext client gets in, whatever the rules say.
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start_in(dir, |c| c.tls = Some(tls(true))).await;
    assert_eq!(
        login(&server, "weir", None).await.err().unwrap(),
        "28000 no pg_hba.conf entry for host \"127.0.0.1\", user \"weir\", database \"weir\", \
         no encryption"
    );
    let weir = login_tls(&server, &ca, Negotiation::Request, "weir", "")
        .await
        .unwrap();
    assert_eq!(one(&weir, "SELECT 1").await, "1");
    drop(weir);

    // A certificate that cannot be read stops the start, naming the file.
    let missing = weir::config::TlsConfig {
        cert: certs.path().join("none.crt"),
        ..tls(false)
    };
    let e = weir::server::Tls::load(Some(&missing)).err().unwrap();
    assert!(e.message.contains("none.crt"), "{}", e.message);
    let swapped = weir::config::TlsConfig {
        cert: key.clone(),
        key: cert.clone(),
        require: false,
    };
    assert!(weir::server::Tls::load(Some(&swapped)).is_err());
}

/// The server's files: without `allowed_paths` only superusers name them (as PostgreSQL lets
/// only superusers COPY from them); with it, every role is confined to its directories, links
/// followed and `..` refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_s_files_are_for_superusers_or_under_allowed_paths() {
    let files = tempfile::tempdir().unwrap();
    let allowed = files.path().join("allowed");
    let elsewhere = files.path().join("elsewhere");
    std::fs::create_dir_all(&allowed).unwrap();
    std::fs::create_dir_all(&elsewhere).unwrap();
    std::fs::write(allowed.join("a.csv"), "1\n").unwrap();
    std::fs::write(elsewhere.join("b.csv"), "2\n").unwrap();
    std::os::unix::fs::symlink(&elsewhere, allowed.join("out")).unwrap();
    let source = |name: &str, path: &std::path::Path| {
        format!(
            "CREATE SOURCE {name} (a int) WITH (connector = 'file', path = '{}') \
             FORMAT PLAIN ENCODE CSV",
            path.display()
        )
    };
    let sink = |name: &str, path: &std::path::Path| {
        format!(
            "CREATE SINK {name} AS SELECT * FROM t WITH (connector = 'file', path = '{}', \
             force_append_only = 'true') FORMAT PLAIN ENCODE CSV",
            path.display()
        )
    };

    let server = TestServer::start().await;
    let weir = server.connect().await;
    outcome(&weir, "CREATE ROLE app LOGIN PASSWORD 'pw'").await;
    outcome(&weir, "GRANT CREATE ON SCHEMA public TO app").await;
    let app = login(&server, "app", Some("pw")).await.unwrap();
    assert_eq!(outcome(&weir, &source("s1", &elsewhere)).await, "ok");
    assert_eq!(
        outcome(&app, &source("s2", &allowed)).await,
        format!(
            "42501 permission denied to use the server's file \"{}\"",
            allowed.display()
        )
    );
    // Connectors' certificates, keys and keytabs are the server's files too, checked before
    // the connector reaches its upstream (none listens here); settings that would load code
    // or run a command are nobody's.
    let ca = elsewhere.join("ca.crt");
    let kafka = |property: &str, value: &str| {
        format!(
            "CREATE SOURCE k (v text) WITH (connector = 'kafka', topic = 't', \
             properties.bootstrap.server = '127.0.0.1:1', properties.{property} = '{value}') \
             FORMAT PLAIN ENCODE JSON"
        )
    };
    let denied = format!(
        "42501 permission denied to use the server's file \"{}\"",
        ca.display()
    );
    for sql in [
        kafka("ssl.ca.location", &ca.display().to_string()),
        kafka("sasl.kerberos.keytab", &ca.display().to_string()),
        format!(
            "CREATE SOURCE p WITH (connector = 'postgres-cdc', hostname = '127.0.0.1', \
             port = '1', username = 'u', database.name = 'd', slot.name = 's', \
             sslmode = 'verify-full', sslrootcert = '{}')",
            ca.display()
        ),
    ] {
        assert_eq!(outcome(&app, &sql).await, denied, "{sql}");
    }
    for property in [
        "plugin.library.paths",
        "ssl.engine.location",
        "sasl.kerberos.kinit.cmd",
    ] {
        let sql = kafka(property, "/tmp/x");
        let expected = format!("42501 permission denied to set properties.{property}");
        assert_eq!(outcome(&weir, &sql).await, expected, "{sql}");
    }
    drop((app, weir, server));

    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start_in(dir, |c| c.allowed_paths = vec![allowed.clone()]).await;
    let weir = server.connect().await;
    outcome(&weir, "CREATE TABLE t (a int)").await;
    outcome(&weir, "CREATE ROLE app LOGIN PASSWORD 'pw'").await;
    outcome(&weir, "GRANT SELECT ON t TO app").await;
    outcome(&weir, "GRANT CREATE ON SCHEMA public TO app").await;
    let app = login(&server, "app", Some("pw")).await.unwrap();
    assert_eq!(outcome(&app, &source("s1", &allowed)).await, "ok");
    assert_eq!(
        outcome(&weir, &sink("k1", &allowed.join("out-dir"))).await,
        "ok"
    );
    let outside = |path: &std::path::Path| {
        format!(
            "42501 permission denied for path \"{}\": it is outside the directories of \
             allowed_paths",
            path.display()
        )
    };
    // A superuser is confined too.
    for (sql, expected) in [
        (source("s2", &elsewhere), outside(&elsewhere)),
        (
            source("s3", &allowed.join("out")),
            outside(&allowed.join("out")),
        ),
        (sink("k2", &elsewhere), outside(&elsewhere)),
        (
            source("s4", &allowed.join("../elsewhere")),
            format!(
                "42501 permission denied for path \"{}\": it must not contain \"..\"",
                allowed.join("../elsewhere").display()
            ),
        ),
    ] {
        assert_eq!(outcome(&weir, &sql).await, expected, "{sql}");
        assert_eq!(outcome(&app, &sql).await, expected, "{sql}");
    }
    assert_eq!(
        one(&weir, "SELECT count(*) FROM weir_catalog.sources").await,
        "1"
    );
}

/// The admin port of `server`, with the server's TLS, on a free loopback port.
async fn admin_port(server: &TestServer, tls: Option<weir::server::Tls>) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let db = server.db.clone();
    tokio::spawn(weir::admin::serve(
        db,
        listener,
        tls,
        std::future::pending(),
    ));
    addr
}

/// An admin request's status and response head, over TLS trusting `ca` when given.
async fn admin(
    addr: std::net::SocketAddr,
    request_line: &str,
    authorization: Option<&str>,
    ca: Option<&std::path::Path>,
) -> (u16, String) {
    use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
    async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(mut s: S, request: String) -> String {
        s.write_all(request.as_bytes()).await.unwrap();
        let mut response = Vec::new();
        let _ = s.read_to_end(&mut response).await;
        String::from_utf8_lossy(&response).into_owned()
    }
    let authorization = authorization
        .map(|a| format!("Authorization: {a}\r\n"))
        .unwrap_or_default();
    let request = format!(
        "{request_line} HTTP/1.1\r\nHost: localhost\r\n{authorization}Content-Length: 0\r\n\r\n"
    );
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let response = match ca {
        None => exchange(tcp, request).await,
        Some(ca) => {
            let name = tokio_rustls::rustls::pki_types::ServerName::try_from("localhost").unwrap();
            let connector = tls_client(ca, b"http/1.1");
            exchange(connector.connect(name, tcp).await.unwrap(), request).await
        }
    };
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let head = response.split("\r\n\r\n").next().unwrap_or("").to_string();
    (status, head)
}

fn basic(user: &str, password: &str) -> String {
    use base64::Engine;
    let encoded = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    format!("Basic {encoded}")
}

/// The admin port: each request proves who sends it, by a token or a role's password (the
/// SQL port's rules deciding), and only a superuser or the admin token changes anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_port_takes_tokens_or_a_role_s_password() {
    let server = TestServer::start_with(|c| {
        c.admin_token = Some("admin-secret".into());
        c.admin_read_token = Some("read-secret".into());
    })
    .await;
    let port = admin_port(&server, None).await;
    let checkpoint = "POST /api/v1/checkpoints";
    let metrics = "GET /metrics";
    // As on the SQL port, the bootstrap superuser is trusted from loopback while it has no
    // password: a request without credentials is its.
    assert_eq!(admin(port, metrics, None, None).await.0, 200);
    assert_eq!(admin(port, checkpoint, None, None).await.0, 200);
    let weir = server.connect().await;
    outcome(&weir, "ALTER ROLE weir PASSWORD 'boot'").await;
    outcome(&weir, "CREATE ROLE app LOGIN PASSWORD 'pw'").await;
    outcome(&weir, "CREATE ROLE quiet PASSWORD 'pw'").await;
    let (status, head) = admin(port, metrics, None, None).await;
    assert_eq!(status, 401);
    assert!(
        head.contains("WWW-Authenticate: Basic realm=\"weir\""),
        "{head}"
    );
    for (request, authorization, expected) in [
        (checkpoint, "Bearer admin-secret".to_string(), 200),
        (metrics, "Bearer admin-secret".to_string(), 200),
        (metrics, "Bearer read-secret".to_string(), 200),
        (checkpoint, "Bearer read-secret".to_string(), 403),
        (metrics, "Bearer admin-secre".to_string(), 401),
        (metrics, "Bearer".to_string(), 401),
        (checkpoint, basic("weir", "boot"), 200),
        (metrics, basic("app", "pw"), 200),
        (checkpoint, basic("app", "pw"), 403),
        (metrics, basic("app", "wrong"), 401),
        (metrics, basic("quiet", "pw"), 401),
        (metrics, basic("nobody", "pw"), 401),
        (metrics, "Basic !!!".to_string(), 401),
        (metrics, "Negotiate abc".to_string(), 401),
    ] {
        assert_eq!(
            admin(port, request, Some(&authorization), None).await.0,
            expected,
            "{request} with {authorization}"
        );
    }
    drop((weir, server));

    // HTTPS with the SQL port's certificate; plain HTTP refused when TLS is required.
    let certs = tempfile::tempdir().unwrap();
    let [ca, cert, key] = common::certificate(certs.path());
    let config = weir::config::TlsConfig {
        cert,
        key,
        require: true,
    };
    let tls = weir::server::Tls::load(Some(&config)).unwrap();
    let server = TestServer::start_with(|c| {
        c.tls = Some(config);
        c.admin_read_token = Some("read-secret".into());
    })
    .await;
    let port = admin_port(&server, tls).await;
    let read = Some("Bearer read-secret");
    assert_eq!(admin(port, metrics, read, Some(&ca)).await.0, 200);
    assert_eq!(admin(port, metrics, read, None).await.0, 403);
    // Over TLS from loopback the bootstrap superuser without a password is trusted, as on
    // the SQL port; without TLS nobody is.
    assert_eq!(admin(port, checkpoint, None, Some(&ca)).await.0, 200);
    assert_eq!(admin(port, checkpoint, None, None).await.0, 403);
}

/// A role's settings (`ALTER ROLE ... SET`) are its sessions' from their start: its
/// `statement_timeout` stops its queries. Setting them follows the role rules, and a value
/// the setting cannot take is refused as `SET` refuses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_s_settings_start_each_of_its_sessions() {
    let server = TestServer::start().await;
    let weir = server.connect().await;
    for sql in [
        "CREATE ROLE app LOGIN PASSWORD 'pw'",
        "CREATE ROLE other LOGIN PASSWORD 'pw'",
        "ALTER ROLE app SET statement_timeout = '150ms'",
        "ALTER ROLE app SET application_name TO 'reports'",
    ] {
        assert_eq!(outcome(&weir, sql).await, "ok", "{sql}");
    }
    assert_eq!(
        outcome(&weir, "ALTER ROLE app SET statement_timeout = 'soon'").await,
        "22023 invalid value for parameter \"statement_timeout\": \"soon\""
    );
    assert_eq!(
        outcome(&weir, "ALTER ROLE app SET server_version = '9'").await[..5].to_string(),
        "55P02"
    );
    // Listed as PostgreSQL lists them, in the order they were set.
    assert_eq!(
        one(
            &weir,
            "SELECT rolconfig FROM pg_roles WHERE rolname = 'app'"
        )
        .await,
        "{statement_timeout=150ms,application_name=reports}"
    );
    let app = login(&server, "app", Some("pw")).await.unwrap();
    assert_eq!(one(&app, "SHOW statement_timeout").await, "150ms");
    assert_eq!(one(&app, "SHOW is_superuser").await, "off");
    assert_eq!(one(&weir, "SHOW is_superuser").await, "on");
    let endless =
        "SELECT sum(a * b) FROM generate_series(1, 100000) AS a, generate_series(1, 100000) AS b";
    assert_eq!(
        outcome(&app, endless).await,
        "57014 canceling statement due to statement timeout"
    );
    // RESET comes back to the role's value, not the server's.
    outcome(&app, "SET statement_timeout = 0").await;
    outcome(&app, "RESET statement_timeout").await;
    assert_eq!(one(&app, "SHOW statement_timeout").await, "150ms");
    // A role sets its own; another's only with CREATEROLE.
    assert_eq!(
        outcome(&app, "ALTER ROLE app RESET application_name").await,
        "ok"
    );
    assert_eq!(
        outcome(&app, "ALTER ROLE other SET statement_timeout = 1").await,
        "42501 permission denied to alter role"
    );
    outcome(&weir, "ALTER ROLE app RESET ALL").await;
    let app = login(&server, "app", Some("pw")).await.unwrap();
    assert_eq!(one(&app, "SHOW statement_timeout").await, "0");
}

/// A client that sends nothing is disconnected after `authentication_timeout_ms`, and its
/// connection slot is free again; a session idle in a transaction block past
/// `idle_in_transaction_session_timeout` ends with 25P03 and its block rolled back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_clients_and_idle_blocks_are_ended() {
    use tokio::io::AsyncReadExt;
    let server = TestServer::start_with(|c| {
        c.authentication_timeout_ms = 300;
        c.connections_max = 1;
    })
    .await;
    let mut silent = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    // Its slot is taken: PostgreSQL's "too many clients".
    assert_eq!(
        login(&server, "weir", None).await.err().unwrap()[..5].to_string(),
        "53300"
    );
    let mut rest = Vec::new();
    let read = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        silent.read_to_end(&mut rest),
    )
    .await;
    assert!(matches!(read, Ok(Ok(0))), "{read:?}");
    // The slot comes free once the closed connection is gone.
    let weir = loop {
        match login(&server, "weir", None).await {
            Ok(client) => break client,
            Err(e) if e.starts_with("53300") => {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await
            }
            Err(e) => panic!("{e}"),
        }
    };
    drop(weir);

    let server = TestServer::start().await;
    let weir = server.connect().await;
    outcome(&weir, "CREATE TABLE t (a int)").await;
    let conn = format!(
        "host=127.0.0.1 port={} user=weir dbname=weir",
        server.addr.port()
    );
    let (idle, connection) = tokio_postgres::connect(&conn, tokio_postgres::NoTls)
        .await
        .unwrap();
    let ended = tokio::spawn(connection);
    for sql in [
        "SET idle_in_transaction_session_timeout = '200ms'",
        // Outside a block the session may wait as long as it likes.
        "SELECT 1",
    ] {
        assert_eq!(outcome(&idle, sql).await, "ok");
    }
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    assert_eq!(
        outcome(&idle, "BEGIN; INSERT INTO t VALUES (1)").await,
        "ok"
    );
    let ended = tokio::time::timeout(std::time::Duration::from_secs(10), ended)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        error(&ended.unwrap_err()),
        "25P03 terminating connection due to idle-in-transaction timeout"
    );
    assert_eq!(one(&weir, "SELECT count(*) FROM t").await, "0");
    assert_eq!(
        outcome(&weir, "SET idle_in_transaction_session_timeout = 'later'").await,
        "22023 invalid value for parameter \"idle_in_transaction_session_timeout\": \"later\""
    );
}

/// What `sql` answers as `client`: its rows joined, or `SQLSTATE message`.
async fn answer(client: &tokio_postgres::Client, sql: &str) -> String {
    match client.simple_query(sql).await {
        Ok(messages) => common::rows_as_text(messages).join("\n"),
        Err(e) => error(&e),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn privileges_are_granted_by_owners_and_refused_with_42501_otherwise() {
    let server = TestServer::start().await;
    let weir = login(&server, "weir", None).await.unwrap();
    for sql in [
        "CREATE USER alice PASSWORD 'a'",
        "CREATE USER bob PASSWORD 'b'",
        "CREATE ROLE readers",
        "CREATE TABLE t (k INT PRIMARY KEY, v INT)",
        "INSERT INTO t VALUES (1, 10), (2, 20)",
        "CREATE MATERIALIZED VIEW total AS SELECT sum(v) AS s FROM t",
    ] {
        assert_eq!(outcome(&weir, sql).await, "ok", "{sql}");
    }
    let alice = login(&server, "alice", Some("a")).await.unwrap();
    let bob = login(&server, "bob", Some("b")).await.unwrap();
    // Nothing granted: every read and write of the superuser's relations is refused, and
    // PostgreSQL 15's public schema takes no new relations from other roles.
    for (sql, expected) in [
        ("SELECT * FROM t", "42501 permission denied for table t"),
        (
            "SELECT s FROM total",
            "42501 permission denied for materialized view total",
        ),
        (
            "SELECT 1 FROM (SELECT k FROM t) AS x",
            "42501 permission denied for table t",
        ),
        (
            "INSERT INTO t VALUES (3, 30)",
            "42501 permission denied for table t",
        ),
        ("UPDATE t SET v = 0", "42501 permission denied for table t"),
        ("DELETE FROM t", "42501 permission denied for table t"),
        ("COPY t TO STDOUT", "42501 permission denied for table t"),
        (
            "SUBSCRIBE TO total",
            "42501 permission denied for materialized view total",
        ),
        ("DROP TABLE t CASCADE", "42501 must be owner of table t"),
        (
            "CREATE TABLE mine (x INT)",
            "42501 permission denied for schema public",
        ),
        (
            "GRANT SELECT ON t TO alice",
            "42501 permission denied for table t",
        ),
        (
            "GRANT CREATE ON SCHEMA public TO alice",
            "42501 permission denied for schema public",
        ),
        (
            "GRANT readers TO alice",
            "42501 must have admin option on role \"readers\"",
        ),
    ] {
        assert_eq!(answer(&alice, sql).await, expected, "{sql}");
    }
    // The catalog's names stay visible to everyone, as in PostgreSQL.
    assert_eq!(
        answer(&alice, "SELECT relname, pg_get_userbyid(relowner) FROM pg_class WHERE relname IN ('t', 'total') ORDER BY 1").await,
        "t weir\ntotal weir"
    );
    // Granted through a role: alice reads what readers may read; bob, not a member, still
    // cannot. INSERT lets her add rows, and UPDATE without SELECT may set constants only.
    for sql in [
        "GRANT SELECT ON total TO readers",
        "GRANT readers TO alice",
        "GRANT INSERT, UPDATE ON t TO alice",
        "GRANT CREATE ON SCHEMA public TO alice",
    ] {
        assert_eq!(outcome(&weir, sql).await, "ok", "{sql}");
    }
    assert_eq!(answer(&alice, "SELECT s FROM total").await, "30");
    // What tools ask before they list relations answers from the same grants.
    assert_eq!(
        answer(
            &alice,
            "SELECT has_table_privilege('total', 'SELECT'), has_table_privilege('t', 'select'), \
             has_table_privilege('t', 'INSERT, DELETE'), has_table_privilege('bob', 'total', 'SELECT'), \
             has_any_column_privilege('t', 'UPDATE'), has_column_privilege('t', 'k', 'SELECT'), \
             has_schema_privilege('public', 'CREATE'), has_table_privilege('pg_class', 'SELECT'), \
             has_table_privilege('weir', 'public.t', 'DELETE')"
        )
        .await,
        "t f t f t f t t t"
    );
    assert_eq!(
        answer(&alice, "SELECT has_table_privilege('t', 'FLY')").await,
        "22023 unrecognized privilege type: \"FLY\""
    );
    assert_eq!(answer(&alice, "INSERT INTO t VALUES (3, 30)").await, "");
    assert_eq!(answer(&alice, "UPDATE t SET v = 5").await, "");
    assert_eq!(
        answer(&alice, "UPDATE t SET v = 5 WHERE k = 1").await,
        "42501 permission denied for table t"
    );
    assert_eq!(
        answer(&alice, "SELECT * FROM t").await,
        "42501 permission denied for table t"
    );
    assert_eq!(
        answer(&bob, "SELECT s FROM total").await,
        "42501 permission denied for materialized view total"
    );
    assert_eq!(
        answer(&weir, "SELECT relacl FROM pg_class WHERE relname = 'total'").await,
        "{weir=arwd/weir,readers=r/weir}"
    );
    assert_eq!(
        answer(&weir, "SELECT pg_get_userbyid(roleid), pg_get_userbyid(member), admin_option FROM pg_auth_members").await,
        "readers alice f"
    );
    // A view reads with its owner's privileges: alice may not build one on t, which she
    // cannot read, but one on total, which she may; what she owns she grants and drops.
    assert_eq!(
        answer(&alice, "CREATE MATERIALIZED VIEW peek AS SELECT k FROM t").await,
        "42501 permission denied for table t"
    );
    for sql in [
        "CREATE MATERIALIZED VIEW doubled AS SELECT s * 2 AS d FROM total",
        "CREATE TABLE notes (n TEXT)",
        "GRANT SELECT ON doubled TO bob",
    ] {
        assert_eq!(answer(&alice, sql).await, "", "{sql}");
    }
    assert_eq!(answer(&bob, "FLUSH").await, "");
    assert_eq!(answer(&bob, "SELECT d FROM doubled").await, "30");
    // weir_catalog's rows show what objects hold (a view's errors, a source's skipped
    // payloads): each role sees those of the relations it may read.
    let views = "SELECT name FROM weir_catalog.views ORDER BY name";
    assert_eq!(answer(&bob, views).await, "doubled");
    assert_eq!(answer(&weir, views).await, "doubled\ntotal");
    let shown = answer(&bob, "SHOW MATERIALIZED VIEWS").await;
    assert!(
        shown.starts_with("doubled ") && !shown.contains("total"),
        "{shown}"
    );
    assert_eq!(
        answer(&bob, "DROP MATERIALIZED VIEW doubled").await,
        "42501 must be owner of materialized view doubled"
    );
    // Revoked, the membership no longer gives SELECT; a cycle of memberships is refused;
    // a role that owns relations cannot be dropped.
    for sql in ["REVOKE readers FROM alice"] {
        assert_eq!(outcome(&weir, sql).await, "ok", "{sql}");
    }
    assert_eq!(
        answer(&alice, "SELECT s FROM total").await,
        "42501 permission denied for materialized view total"
    );
    assert_eq!(outcome(&weir, "GRANT alice TO readers").await, "ok");
    assert_eq!(
        answer(&weir, "GRANT readers TO alice").await,
        "0LP01 role \"readers\" is a member of role \"alice\""
    );
    assert_eq!(
        answer(&weir, "DROP ROLE alice").await,
        "2BP01 role \"alice\" cannot be dropped because some objects depend on it"
    );
    assert_eq!(
        answer(&weir, "GRANT DELETE ON SCHEMA public TO bob").await,
        "0LP01 invalid privilege type DELETE for schema"
    );
    assert_eq!(answer(&alice, "DROP MATERIALIZED VIEW doubled").await, "");
    assert_eq!(answer(&weir, "DROP TABLE notes").await, "");
    assert_eq!(answer(&weir, "REVOKE ALL ON t FROM alice").await, "");
    assert_eq!(
        answer(&weir, "REVOKE CREATE ON SCHEMA public FROM alice").await,
        ""
    );
    assert_eq!(answer(&weir, "DROP ROLE alice").await, "");
    // Grants are in the catalog: they hold after a restart.
    drop((alice, bob, weir));
    let dir = server.stop_and_close().await;
    let server = TestServer::start_in(dir, |_| {}).await;
    let weir = login(&server, "weir", None).await.unwrap();
    assert_eq!(
        answer(&weir, "SELECT relacl FROM pg_class WHERE relname = 'total'").await,
        "{weir=arwd/weir,readers=r/weir}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_sees_and_signals_only_the_sessions_of_roles_it_has_the_privileges_of() {
    let server = TestServer::start().await;
    let weir = login(&server, "weir", None).await.unwrap();
    for sql in [
        "CREATE USER alice PASSWORD 'a'",
        "CREATE USER bob PASSWORD 'b'",
        "CREATE USER carol PASSWORD 'c'",
        "GRANT bob TO carol",
    ] {
        assert_eq!(outcome(&weir, sql).await, "ok", "{sql}");
    }
    let alice = login(&server, "alice", Some("a")).await.unwrap();
    let bob = login(&server, "bob", Some("b")).await.unwrap();
    let carol = login(&server, "carol", Some("c")).await.unwrap();
    let pid =
        |name: &'static str| format!("(SELECT pid FROM pg_stat_activity WHERE usename = '{name}')");
    assert_eq!(answer(&bob, "SELECT 'bob was here'").await, "bob was here");
    // Another role's session shows who it is, not where from or what it runs; a session of
    // a role one is a member of shows everything, and a superuser sees every session.
    let seen = "SELECT usename, usesysid = r.oid, client_port IS NULL, backend_start IS NULL, \
                state IS NULL, query FROM pg_stat_activity JOIN pg_roles r ON r.rolname = usename \
                WHERE usename = 'bob'";
    assert_eq!(
        answer(&alice, seen).await,
        "bob t t t t <insufficient privilege>"
    );
    assert_eq!(
        answer(&carol, seen).await,
        "bob t f f f SELECT 'bob was here'"
    );
    assert_eq!(
        answer(&weir, seen).await,
        "bob t f f f SELECT 'bob was here'"
    );
    // Signals follow PostgreSQL's rules and words: nobody but a superuser signals one, and
    // a role signals the sessions of roles whose privileges it has.
    for (verb, target, expected) in [
        ("cancel", "weir", "42501 must be a superuser to cancel superuser query"),
        ("terminate", "weir", "42501 must be a superuser to terminate superuser process"),
        ("cancel", "bob", "42501 must be a member of the role whose query is being canceled or member of pg_signal_backend"),
        ("terminate", "bob", "42501 must be a member of the role whose process is being terminated or member of pg_signal_backend"),
    ] {
        let sql = format!("SELECT pg_{verb}_backend({})", pid(target));
        assert_eq!(answer(&alice, &sql).await, expected, "{sql}");
    }
    let cancel = format!("SELECT pg_cancel_backend({})", pid("bob"));
    assert_eq!(answer(&carol, &cancel).await, "t");
    let terminate = format!("SELECT pg_terminate_backend({})", pid("alice"));
    assert_eq!(answer(&weir, &terminate).await, "t");
    assert_eq!(answer(&bob, "SELECT 1").await, "1");
}

const SECRET_KEY: &str = "5f1d3c9a7e2b4d6f8a0c1e3f5b7d9a2c4e6f8b0d2a4c6e8f0b2d4f6a8c0e2b4d";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_are_their_owners_to_use_and_need_the_server_s_key() {
    // Without a key no secret can be kept.
    let keyless = TestServer::start().await;
    let weir = login(&keyless, "weir", None).await.unwrap();
    assert_eq!(
        answer(&weir, "CREATE SECRET pw AS 'x'").await,
        "55000 the server has no secret key to encrypt secrets with"
    );
    drop(weir);
    let server = TestServer::start_with(|c| c.secret_key = Some(SECRET_KEY.into())).await;
    let weir = login(&server, "weir", None).await.unwrap();
    for sql in [
        "CREATE USER alice PASSWORD 'a'",
        "GRANT CREATE ON SCHEMA public TO alice",
        "CREATE SECRET events WITH (backend = 'meta') AS '7'",
        "CREATE SECRET IF NOT EXISTS events AS '8'",
    ] {
        assert_eq!(outcome(&weir, sql).await, "ok", "{sql}");
    }
    let alice = login(&server, "alice", Some("a")).await.unwrap();
    let source = |secret: &str| {
        format!("CREATE SOURCE bids_{secret} WITH (connector = 'nexmark', stream = 'bid', events = SECRET {secret})")
    };
    for (client, sql, expected) in [
        (&weir, "CREATE SECRET events AS '1'", "42710 secret \"events\" already exists"),
        (&weir, "BEGIN; CREATE SECRET other AS '1'", "25001 CREATE SECRET cannot run inside a transaction block"),
        (&weir, "ROLLBACK", ""),
        (&weir, "CREATE SECRET other WITH (backend = 'vault') AS '1'", "0A000 secret backend \"vault\" is not supported"),
        // Only its owner uses, changes or drops a secret.
        (&alice, &source("events"), "42501 permission denied for secret events"),
        (&alice, "ALTER SECRET events AS '9'", "42501 permission denied for secret events"),
        (&alice, "DROP SECRET events", "42501 permission denied for secret events"),
        (&alice, &source("nothing"), "42704 secret \"nothing\" does not exist"),
        (&alice, "CREATE SECRET mine AS '3'", ""),
        (&alice, &source("mine"), ""),
        (&weir, &source("events"), ""),
        // The secret's value is the option's: the 7 events of Nexmark's generator have 3
        // bids, as when the option is written out; the first 3 events have none.
        (&weir, "CREATE MATERIALIZED VIEW n AS SELECT count(*) AS n FROM bids_events", ""),
        (&alice, "CREATE MATERIALIZED VIEW m AS SELECT count(*) AS n FROM bids_mine", ""),
        (&weir, "CREATE SOURCE plain WITH (connector = 'nexmark', stream = 'bid', events = '7')", ""),
        (&weir, "CREATE MATERIALIZED VIEW p AS SELECT count(*) AS n FROM plain", ""),
        (&weir, "FLUSH", ""),
        (&weir, "SELECT n.n, p.n FROM n, p", "3 3"),
        (&alice, "SELECT n FROM m", "0"),
        // A secret in use stays; a role that owns one cannot be dropped.
        (&weir, "DROP SECRET events", "2BP01 cannot drop secret events because other objects depend on it"),
        (&weir, "DROP ROLE alice", "2BP01 role \"alice\" cannot be dropped because some objects depend on it"),
        (&weir, "SHOW CREATE SOURCE bids_events", "bids_events CREATE SOURCE bids_events WITH (connector = 'nexmark', stream = 'bid', events = SECRET events)"),
        (&weir, "SELECT name, owner, backend FROM weir_catalog.secrets ORDER BY name", "events weir meta\nmine alice meta"),
        (&weir, "DROP MATERIALIZED VIEW n", ""),
        (&weir, "DROP SOURCE bids_events", ""),
        (&weir, "DROP SECRET events", ""),
        (&weir, "DROP SECRET IF EXISTS events", ""),
        (&weir, "DROP SECRET events", "42704 secret \"events\" does not exist"),
    ] {
        if sql == "FLUSH" {
            // On a loaded machine the sources may not have produced their 7 events yet.
            common::drain(&weir, std::time::Duration::from_secs(60)).await;
        }
        assert_eq!(answer(client, sql).await, expected, "{sql}");
    }
    // What a session runs shows no secret's value.
    assert_eq!(answer(&alice, "ALTER SECRET mine AS 'hunter2'").await, "");
    assert_eq!(
        answer(
            &weir,
            "SELECT query FROM pg_stat_activity WHERE usename = 'alice'"
        )
        .await,
        "ALTER SECRET mine AS '********'"
    );
    // Kept in the catalog only encrypted.
    let catalog = std::fs::read_to_string(server.dir.path().join("catalog.json")).unwrap();
    assert!(catalog.contains("\"mine\"") && !catalog.contains("hunter2"));
}
