//! `CREATE`, `ALTER` and `DROP SECRET` as the session's role, and the secrets a new
//! connector's options name (`password = SECRET name`): their values go to the connector, and
//! the catalog keeps only which options they were (`docs/design/0021-secrets.md`).

use std::collections::BTreeMap;

use datafusion::sql::sqlparser::ast;

use crate::catalog::{undefined_secret, Connector, RoleDef, SecretDef};
use crate::error::{Error, ErrorKind, Result};
use crate::sql::SecretStatement;

use super::{Database, Output};

/// Which options of a new connector name secrets, and the secrets' names.
pub(super) type SecretOptions = BTreeMap<String, String>;

fn denied(name: &str) -> Error {
    Error::new(
        ErrorKind::InsufficientPrivilege,
        format!("permission denied for secret {name}"),
    )
}

impl Database {
    /// Runs a secret statement as the session's role `actor`.
    pub async fn secret_statement(
        &self,
        actor: &str,
        statement: &SecretStatement,
    ) -> Result<Output> {
        let _ddl = self.ddl.lock().await;
        let role = self.acting(actor)?;
        match statement {
            SecretStatement::Create {
                name,
                if_not_exists,
                value,
            } => {
                self.check_create(&role)?;
                if self.catalog().secret(name).is_some() {
                    if *if_not_exists {
                        return Ok(Output::command(statement.tag()));
                    }
                    return Err(Error::new(
                        ErrorKind::DuplicateNamed,
                        format!("secret \"{name}\" already exists"),
                    ));
                }
                let def = SecretDef::new(name, role.oid, value, &self.secret_keys)?;
                self.catalog_mut().put_secret(def, value)?;
            }
            SecretStatement::Alter { name, value } => {
                let owner = self.owned_secret(&role, name)?.owner;
                let def = SecretDef::new(name, owner, value, &self.secret_keys)?;
                self.catalog_mut().put_secret(def, value)?;
            }
            SecretStatement::Drop { name, if_exists } => {
                if *if_exists && self.catalog().secret(name).is_none() {
                    return Ok(Output::command(statement.tag()));
                }
                self.owned_secret(&role, name)?;
                self.catalog_mut().drop_secret(name)?;
            }
        }
        Ok(Output::command(statement.tag()))
    }

    /// Secret `name`, which `role` must own (or have its owner's privileges, or be a
    /// superuser) to use, change or drop.
    fn owned_secret(&self, role: &RoleDef, name: &str) -> Result<SecretDef> {
        let catalog = self.catalog();
        let secret = catalog.secret(name).ok_or_else(|| undefined_secret(name))?;
        let owns = role.superuser || catalog.privileged_as(role).contains(&secret.owner);
        if !owns {
            return Err(denied(name));
        }
        Ok(secret.clone())
    }

    /// Puts in place of each option value of `options` that names a secret (`SECRET name`)
    /// the secret's value, as `role` may use it; returns which options they were. `key`
    /// names an option as its connector reads it.
    pub(super) fn open_secrets(
        &self,
        role: &RoleDef,
        options: &mut [ast::SqlOption],
        key: impl Fn(&ast::Ident) -> String,
    ) -> Result<SecretOptions> {
        let mut named = SecretOptions::new();
        for option in options {
            let ast::SqlOption::KeyValue { key: k, value } = option else {
                continue;
            };
            let Some(name) = crate::sql::secret_reference(value) else {
                continue;
            };
            let secret = self.owned_secret(role, &name)?;
            let plain = secret.value(&self.secret_keys)?;
            *value = ast::Expr::value(ast::Value::SingleQuotedString(plain));
            named.insert(key(k), name);
        }
        Ok(named)
    }
}

/// Records in `connector` which of its options are the secrets `named`; refuses (0A000) an
/// option the connector did not keep under the name it was given, whose value the catalog
/// would otherwise hold in clear.
pub(super) fn mark_secrets(connector: &mut Connector, named: SecretOptions) -> Result<()> {
    if let Some(option) = named.keys().find(|k| !connector.options.contains_key(*k)) {
        return Err(Error::not_supported(format!(
            "option \"{option}\" of connector \"{}\" cannot name a secret",
            connector.name
        )));
    }
    connector.secrets = named;
    Ok(())
}

/// The options of a `CREATE TABLE` or `CREATE SOURCE`, to put secrets' values in.
pub(super) fn with_options(ct: &mut ast::CreateTable) -> &mut [ast::SqlOption] {
    match &mut ct.table_options {
        ast::CreateTableOptions::With(options) => options,
        _ => &mut [],
    }
}
