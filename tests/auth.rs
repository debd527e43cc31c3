//! Roles and authentication (`docs/design/0019-authentication.md`): SCRAM-SHA-256 against
//! verifiers kept in the catalog, the bootstrap superuser trusted from loopback until it has
//! a password, `[[auth]]` rules choosing the method by address and user as pg_hba.conf does,
//! and each refusal with PostgreSQL's SQLSTATE.

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
        "28000 pg_hba.conf rejects connection for host \"127.0.0.1\", user \"shut\", database \"weir\""
    );
    // No rule covers another user from 127.0.0.2.
    assert_eq!(
        login_from(&server, "127.0.0.2", "weir", "boot pw")
            .await
            .err()
            .unwrap(),
        "28000 no pg_hba.conf entry for host \"127.0.0.2\", user \"weir\", database \"weir\""
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
