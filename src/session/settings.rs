//! A session's settings: the values every session starts with, as PostgreSQL 15 reports
//! them, and SET and SHOW.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::array::{RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::sql::sqlparser::ast;

use crate::db::{text_rows, Output};
use crate::error::{Error, ErrorKind, Result};
use crate::sql::{setting_name, setting_value, STATEMENT_MEM};

use super::Session;

/// Settings every session starts with, as PostgreSQL 15 reports them (names lower-case).
pub(super) fn default_settings() -> HashMap<String, String> {
    let pairs = [
        ("application_name", ""),
        ("client_encoding", "UTF8"),
        ("datestyle", "ISO, MDY"),
        ("default_table_access_method", "heap"),
        ("default_transaction_isolation", "read committed"),
        ("default_transaction_read_only", "off"),
        ("extra_float_digits", "1"),
        ("in_hot_standby", "off"),
        ("integer_datetimes", "on"),
        ("intervalstyle", "postgres"),
        ("is_superuser", "on"),
        ("lc_messages", "C"),
        ("max_identifier_length", "63"),
        ("read_after_write", "on"),
        ("search_path", "\"$user\", public"),
        ("server_encoding", "UTF8"),
        ("server_version", crate::PG_VERSION),
        ("server_version_num", crate::PG_VERSION_NUM),
        ("session_authorization", crate::sql::ROLE_NAME),
        ("standard_conforming_strings", "on"),
        ("statement_timeout", "0"),
        ("statement_mem", "0"),
        ("idle_in_transaction_session_timeout", "0"),
        ("timezone", "UTC"),
        ("transaction_isolation", "read committed"),
        ("transaction_read_only", "off"),
    ];
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Settings whose only supported value is fixed: Weir computes and prints in UTC, ISO date
/// style and UTF-8.
fn fixed_setting(name: &str) -> Option<&'static [&'static str]> {
    match name {
        "timezone" => Some(&["utc", "etc/utc", "gmt", "z", "zulu", "+00:00", "0", "00:00"]),
        "client_encoding" => Some(&["utf8", "utf-8", "unicode"]),
        "datestyle" => Some(&["iso, mdy", "iso", "iso,mdy", "iso, ymd", "iso,ymd"]),
        _ => None,
    }
}

impl Session {
    /// Starts the session as `role`: `is_superuser` says whether it is one, and the settings
    /// `ALTER ROLE ... SET` gave it are the session's from the start (and what `RESET` comes
    /// back to); one no longer valid is skipped, with a warning in the log.
    pub fn start_as(&mut self, role: &crate::catalog::RoleDef) {
        (self.settings).insert("is_superuser".into(), on_off(role.superuser).into());
        // The role's statement_mem, which its sessions may lower but not raise.
        let own = role.settings.iter().find(|(k, _)| k == STATEMENT_MEM);
        if let Some(Ok(bytes)) = own.map(|(k, v)| crate::sql::parse_memory(k, v)) {
            self.statement_mem_max = bytes;
        }
        for (name, value) in &role.settings {
            if let Err(e) = self.assign(name, value.clone()) {
                tracing::warn!(role = %role.name, "role setting {name} skipped: {}", e.message);
            }
        }
        self.initial = self.settings.clone();
    }

    /// Checks that `value` is one `name` can take, as `SET` would, changing nothing.
    pub(super) fn check_setting(&mut self, name: &str, value: &str) -> Result<()> {
        let kept = self.settings.clone();
        let checked = self.assign(name, value.to_string());
        self.settings = kept;
        checked
    }

    pub(super) fn set(&mut self, set: &ast::Set) -> Result<Output> {
        match set {
            ast::Set::SingleAssignment {
                scope,
                variable,
                values,
                ..
            } => {
                let name = variable.to_string().to_lowercase();
                let value = values
                    .iter()
                    .map(setting_value)
                    .collect::<Vec<_>>()
                    .join(", ");
                let local = matches!(scope, Some(ast::ContextModifier::Local));
                match self.begun.as_mut() {
                    // SET LOCAL lasts until the block ends: the value before it comes back
                    // then, committed or not.
                    Some(begun) if local => {
                        let before = self.settings.get(&name).cloned();
                        begun.local.entry(name.clone()).or_insert(before);
                    }
                    Some(begun) => {
                        begun.local.remove(&name);
                    }
                    // Outside a block, SET LOCAL does nothing (PostgreSQL warns).
                    None if local => return Ok(Output::command("SET")),
                    None => {}
                }
                self.assign(&name, value)?;
            }
            ast::Set::SetTimeZone { value, .. } => self.assign("timezone", setting_value(value))?,
            // The characteristics of the transactions to come.
            ast::Set::SetTransaction {
                modes,
                session: true,
                ..
            } => {
                for mode in modes {
                    let (name, value) = transaction_mode(mode);
                    self.assign(&format!("default_{name}"), value)?;
                }
            }
            // This block's; outside a block it does nothing (PostgreSQL warns).
            ast::Set::SetTransaction { modes, .. } => {
                if self.begun.is_some() {
                    self.transaction_modes(modes)?;
                }
            }
            ast::Set::SetNames { charset_name, .. } => {
                self.assign("client_encoding", charset_name.value.clone())?
            }
            other => return Err(Error::not_supported(format!("{other} is not supported"))),
        }
        Ok(Output::command("SET"))
    }

    /// Applies a block's modes (BEGIN's, or SET TRANSACTION's) to the settings that report
    /// them, `transaction_isolation` and `transaction_read_only`.
    pub(super) fn transaction_modes(&mut self, modes: &[ast::TransactionMode]) -> Result<()> {
        for mode in modes {
            let (name, value) = transaction_mode(mode);
            self.assign(name, value)?;
        }
        Ok(())
    }

    /// A superuser's session may set any `statement_mem`; another may lower its role's (or
    /// the server's, when its role has none), not raise it nor lift it (0), as PostgreSQL holds
    /// its superuser-only settings.
    fn may_set_statement_mem(&self, bytes: u64) -> Result<()> {
        let most = self.statement_mem_max;
        let superuser = self.settings.get("is_superuser").is_none_or(|v| v == "on");
        if superuser || most == 0 || (bytes != 0 && bytes <= most) {
            return Ok(());
        }
        Err(Error::new(
            ErrorKind::InsufficientPrivilege,
            format!("permission denied to set parameter \"{STATEMENT_MEM}\""),
        )
        .with_detail(format!(
            "Statements of this session may use at most {} of working memory; only a \
             superuser may raise it.",
            crate::sql::memory_text(most)
        )))
    }

    /// Whether the session's current transaction (its block, or the statement's own outside
    /// one) is read-only.
    pub(super) fn read_only(&self) -> bool {
        let name = if self.begun.is_some() {
            "transaction_read_only"
        } else {
            "default_transaction_read_only"
        };
        self.settings.get(name).is_some_and(|v| v == "on")
    }

    /// RESET: settings back to what the session started with (a custom setting it did not
    /// start with is gone).
    pub(super) fn reset(&mut self, reset: &ast::Reset) -> Output {
        match reset {
            ast::Reset::ALL => self.settings = self.initial.clone(),
            ast::Reset::ConfigurationParameter(name) => {
                let name = name.to_string().to_lowercase();
                match self.initial.get(&name) {
                    Some(v) => {
                        self.settings.insert(name, v.clone());
                    }
                    None => {
                        self.settings.remove(&name);
                    }
                }
            }
        }
        Output::command("RESET")
    }

    fn assign(&mut self, name: &str, value: String) -> Result<()> {
        let value = if value.eq_ignore_ascii_case("default") {
            if name == "streaming_parallelism" {
                let n = self.db.config.streaming_parallelism.max(1);
                self.settings.insert(name.to_string(), n.to_string());
                return Ok(());
            }
            if name == "read_after_write" {
                let on = on_off(self.db.config.read_after_write);
                self.settings.insert(name.to_string(), on.to_string());
                return Ok(());
            }
            if name == STATEMENT_MEM {
                let text = crate::sql::memory_text(self.statement_mem_max);
                self.settings.insert(name.to_string(), text);
                return Ok(());
            }
            match default_settings().get(name) {
                Some(v) => v.clone(),
                None => return Ok(()),
            }
        } else {
            value
        };
        if let Some(allowed) = fixed_setting(name) {
            if !allowed.contains(&value.to_lowercase().as_str()) {
                return Err(Error::new(
                    ErrorKind::InvalidParameter,
                    format!("invalid value for parameter \"{name}\": \"{value}\""),
                )
                .with_hint(format!(
                    "Weir supports only {} for {name}.",
                    default_settings().get(name).cloned().unwrap_or_default()
                )));
            }
            return Ok(());
        }
        if name == "streaming_parallelism" {
            crate::db::parse_parallelism(&value)?;
        }
        if name == STATEMENT_MEM {
            let bytes = crate::sql::parse_memory(name, &value)?;
            self.may_set_statement_mem(bytes)?;
        }
        if matches!(
            name,
            "statement_timeout" | "idle_in_transaction_session_timeout"
        ) {
            parse_timeout(name, &value)?;
        }
        if matches!(
            name,
            "read_after_write" | "default_transaction_read_only" | "transaction_read_only"
        ) {
            let on = parse_bool(name, &value)?;
            self.settings
                .insert(name.to_string(), on_off(on).to_string());
            return Ok(());
        }
        // Unknown settings are kept (and shown back) like PostgreSQL's custom settings;
        // read-only ones are refused.
        if matches!(
            name,
            "server_version"
                | "server_version_num"
                | "server_encoding"
                | "integer_datetimes"
                | "max_identifier_length"
                | "is_superuser"
                | "in_hot_standby"
                | "session_authorization"
        ) {
            return Err(Error::new(
                ErrorKind::CantChangeRuntimeParam,
                format!("parameter \"{name}\" cannot be changed"),
            ));
        }
        self.settings.insert(name.to_string(), value);
        Ok(())
    }

    pub(super) fn show(&self, variable: &[ast::Ident]) -> Result<Output> {
        let words: Vec<String> = variable.iter().map(|i| i.value.to_lowercase()).collect();
        let name = match words.join(" ").as_str() {
            "transaction isolation level" => "transaction_isolation".to_string(),
            "time zone" => "timezone".to_string(),
            other => other.replace(' ', "_"),
        };
        if name == "all" {
            let mut rows: Vec<Vec<String>> = self
                .settings
                .iter()
                .map(|(k, v)| vec![setting_name(k).to_string(), v.clone(), String::new()])
                .collect();
            rows.sort_by(|a, b| a[0].to_lowercase().cmp(&b[0].to_lowercase()));
            return text_rows(&["name", "setting", "description"], rows);
        }
        let value = self.settings.get(&name).cloned().ok_or_else(|| {
            Error::new(
                ErrorKind::UndefinedObject,
                format!("unrecognized configuration parameter \"{name}\""),
            )
        })?;
        let column = setting_name(&name);
        let schema = Arc::new(Schema::new(vec![Field::new(column, DataType::Utf8, false)]));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![Arc::new(StringArray::from(vec![value]))],
        )?;
        Ok(Output::Rows {
            schema,
            batches: vec![batch],
        })
    }
}

/// The setting a transaction mode sets (without its `default_`), and its value.
fn transaction_mode(mode: &ast::TransactionMode) -> (&'static str, String) {
    match mode {
        ast::TransactionMode::AccessMode(ast::TransactionAccessMode::ReadOnly) => {
            ("transaction_read_only", "on".into())
        }
        ast::TransactionMode::AccessMode(ast::TransactionAccessMode::ReadWrite) => {
            ("transaction_read_only", "off".into())
        }
        ast::TransactionMode::IsolationLevel(level) => {
            ("transaction_isolation", level.to_string().to_lowercase())
        }
    }
}

/// A Boolean setting as PostgreSQL reads one: `on`, `off`, `true`, `false`, `yes`, `no`, `1`,
/// `0`, or a unique prefix of the words (any case).
fn parse_bool(name: &str, value: &str) -> Result<bool> {
    let v = value.trim().to_lowercase();
    let is = |word: &str, shortest: usize| v.len() >= shortest && word.starts_with(v.as_str());
    if v == "1" || is("true", 1) || is("yes", 1) || is("on", 2) {
        Ok(true)
    } else if v == "0" || is("false", 1) || is("no", 1) || is("off", 2) {
        Ok(false)
    } else {
        Err(Error::new(
            ErrorKind::InvalidParameter,
            format!("parameter \"{name}\" requires a Boolean value"),
        ))
    }
}

pub(super) fn on_off(on: bool) -> &'static str {
    if on {
        "on"
    } else {
        "off"
    }
}

/// The longest `statement_timeout` PostgreSQL accepts: 2^31 - 1 milliseconds.
const TIMEOUT_MAX_MS: u64 = i32::MAX as u64;

/// A timeout setting `name` (`statement_timeout`, `idle_in_transaction_session_timeout`) as
/// PostgreSQL reads it: milliseconds, or a number with a unit (`us`, `ms`, `s`, `min`, `h`,
/// `d`); 0 turns it off.
pub fn parse_timeout(name: &str, value: &str) -> Result<std::time::Duration> {
    let invalid = |hint: &str| {
        Error::new(
            ErrorKind::InvalidParameter,
            format!("invalid value for parameter \"{name}\": \"{value}\""),
        )
        .with_hint(hint.to_string())
    };
    let text = value.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: f64 = number.parse().map_err(|_| {
        invalid(
            "Valid units for this parameter are \"us\", \"ms\", \"s\", \"min\", \"h\", and \"d\".",
        )
    })?;
    let ms_per_unit = match unit.trim() {
        "" | "ms" => 1.0,
        "us" => 0.001,
        "s" => 1000.0,
        "min" => 60_000.0,
        "h" => 3_600_000.0,
        "d" => 86_400_000.0,
        _ => return Err(invalid(
            "Valid units for this parameter are \"us\", \"ms\", \"s\", \"min\", \"h\", and \"d\".",
        )),
    };
    let ms = (number * ms_per_unit).round();
    if !(0.0..=TIMEOUT_MAX_MS as f64).contains(&ms) {
        return Err(Error::new(
            ErrorKind::InvalidParameter,
            format!(
                "{ms} ms is outside the valid range for parameter \"{name}\" (0 .. {TIMEOUT_MAX_MS})"
            ),
        ));
    }
    Ok(std::time::Duration::from_millis(ms as u64))
}
