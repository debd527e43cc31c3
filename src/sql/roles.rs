//! `CREATE ROLE`, `CREATE USER`, `ALTER ROLE` and `DROP ROLE` read into what they ask: the
//! attributes a role gets or changes (`docs/design/0019-authentication.md`).

use datafusion::sql::sqlparser::ast;

use super::ddl::ident_name;
use crate::error::{Error, ErrorKind, Result};

/// What a `CREATE ROLE` or `ALTER ROLE` sets; `None`: left as it is (or the default).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RoleSpec {
    pub login: Option<bool>,
    pub superuser: Option<bool>,
    pub create_role: Option<bool>,
    pub create_db: Option<bool>,
    /// `PASSWORD 'x'`: `Some(Some(x))`; `PASSWORD NULL`: `Some(None)`.
    pub password: Option<Option<String>>,
    pub connection_limit: Option<i32>,
    pub inherit: Option<bool>,
}

/// A role statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RoleStatement {
    Create {
        name: String,
        if_not_exists: bool,
        spec: RoleSpec,
    },
    Alter {
        name: String,
        spec: RoleSpec,
    },
    Drop {
        names: Vec<String>,
        if_exists: bool,
    },
    /// `ALTER ROLE name SET setting = value` (`value` `None`: `RESET setting` or `SET setting
    /// TO DEFAULT`; `setting` `None`: `RESET ALL`).
    Set {
        name: String,
        setting: Option<String>,
        value: Option<String>,
    },
}

impl RoleStatement {
    /// The command tag, and what a read-only transaction refuses.
    pub fn tag(&self) -> &'static str {
        match self {
            RoleStatement::Create { .. } => "CREATE ROLE",
            RoleStatement::Alter { .. } | RoleStatement::Set { .. } => "ALTER ROLE",
            RoleStatement::Drop { .. } => "DROP ROLE",
        }
    }
}

fn unsupported(what: &str) -> Error {
    Error::not_supported(format!("{what} is not supported for roles yet"))
}

fn limit(e: &ast::Expr) -> Result<i32> {
    let text = e.to_string();
    let n: i32 = text.trim().parse().map_err(|_| {
        Error::new(
            ErrorKind::InvalidParameter,
            format!("invalid connection limit: {text}"),
        )
    })?;
    if n < -1 {
        return Err(Error::new(
            ErrorKind::InvalidParameter,
            format!("invalid connection limit: {n}"),
        ));
    }
    Ok(n)
}

fn password(p: &ast::Password) -> Result<Option<String>> {
    match p {
        ast::Password::NullPassword => Ok(None),
        ast::Password::Password(ast::Expr::Value(v)) => match &v.value {
            ast::Value::SingleQuotedString(s) | ast::Value::EscapedStringLiteral(s) => {
                Ok(Some(s.clone()))
            }
            ast::Value::Null => Ok(None),
            _ => Err(Error::syntax("a password is a string constant")),
        },
        ast::Password::Password(_) => Err(Error::syntax("a password is a string constant")),
    }
}

fn checked_name(name: String) -> Result<String> {
    if name.starts_with("pg_") {
        return Err(Error::new(
            ErrorKind::ReservedName,
            format!("role name \"{name}\" is reserved"),
        )
        .with_detail("Role names starting with \"pg_\" are reserved."));
    }
    if name.is_empty() || name == "public" || name == "none" {
        return Err(Error::new(
            ErrorKind::ReservedName,
            format!("role name \"{name}\" is reserved"),
        ));
    }
    Ok(name)
}

/// `CREATE ROLE name [WITH] options`; `user`: `CREATE USER`, whose role may log in unless
/// it says `NOLOGIN`.
pub fn create_role(c: &ast::CreateRole, user: bool) -> Result<RoleStatement> {
    let [name] = c.names.as_slice() else {
        return Err(unsupported("creating several roles in one statement"));
    };
    let members = [&c.in_role, &c.in_group, &c.role, &c.user, &c.admin];
    if members.iter().any(|m| !m.is_empty()) {
        return Err(unsupported("role membership (IN ROLE, ROLE, ADMIN)"));
    }
    if c.valid_until.is_some() {
        return Err(unsupported("VALID UNTIL"));
    }
    if c.replication == Some(true) || c.bypassrls == Some(true) {
        return Err(unsupported("REPLICATION and BYPASSRLS"));
    }
    let spec = RoleSpec {
        login: c.login.or(user.then_some(true)),
        superuser: c.superuser,
        create_role: c.create_role,
        create_db: c.create_db,
        password: c.password.as_ref().map(password).transpose()?,
        connection_limit: c.connection_limit.as_ref().map(limit).transpose()?,
        inherit: c.inherit,
    };
    let name = super::relation_name(name)?;
    Ok(RoleStatement::Create {
        name: checked_name(name)?,
        if_not_exists: c.if_not_exists,
        spec,
    })
}

/// `ALTER ROLE name [WITH] options`.
pub fn alter_role(name: &ast::Ident, operation: &ast::AlterRoleOperation) -> Result<RoleStatement> {
    let options = match operation {
        ast::AlterRoleOperation::WithOptions { options } => options,
        ast::AlterRoleOperation::Set {
            config_name,
            config_value,
            in_database: None,
        } => {
            let value = match config_value {
                ast::SetConfigValue::Default => None,
                ast::SetConfigValue::Value(v) => Some(setting_value(v)),
                ast::SetConfigValue::FromCurrent => {
                    return Err(unsupported("SET ... FROM CURRENT"))
                }
            };
            return Ok(RoleStatement::Set {
                name: ident_name(name),
                setting: Some(config_name.to_string().to_lowercase()),
                value,
            });
        }
        ast::AlterRoleOperation::Reset {
            config_name,
            in_database: None,
        } => {
            let setting = match config_name {
                ast::ResetConfig::ALL => None,
                ast::ResetConfig::ConfigName(n) => Some(n.to_string().to_lowercase()),
            };
            return Ok(RoleStatement::Set {
                name: ident_name(name),
                setting,
                value: None,
            });
        }
        _ => return Err(unsupported(&format!("ALTER ROLE {operation}"))),
    };
    let mut spec = RoleSpec::default();
    for option in options {
        match option {
            ast::RoleOption::Login(v) => spec.login = Some(*v),
            ast::RoleOption::SuperUser(v) => spec.superuser = Some(*v),
            ast::RoleOption::CreateRole(v) => spec.create_role = Some(*v),
            ast::RoleOption::CreateDB(v) => spec.create_db = Some(*v),
            ast::RoleOption::Password(p) => spec.password = Some(password(p)?),
            ast::RoleOption::ConnectionLimit(e) => spec.connection_limit = Some(limit(e)?),
            ast::RoleOption::Inherit(v) => spec.inherit = Some(*v),
            ast::RoleOption::Replication(false) | ast::RoleOption::BypassRLS(false) => {}
            other => return Err(unsupported(&other.to_string())),
        }
    }
    Ok(RoleStatement::Alter {
        name: ident_name(name),
        spec,
    })
}

/// A setting's value as `SET` reads it: a string's contents, anything else as written.
pub fn setting_value(e: &ast::Expr) -> String {
    match e {
        ast::Expr::Value(v) => match &v.value {
            ast::Value::SingleQuotedString(s) | ast::Value::DoubleQuotedString(s) => s.clone(),
            other => other.to_string(),
        },
        ast::Expr::Identifier(i) => i.value.clone(),
        other => other.to_string(),
    }
}

/// `DROP ROLE [IF EXISTS] names`.
pub fn drop_roles(names: &[ast::ObjectName], if_exists: bool) -> Result<RoleStatement> {
    Ok(RoleStatement::Drop {
        names: names
            .iter()
            .map(super::relation_name)
            .collect::<Result<_>>()?,
        if_exists,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sql::parser::{parse, Statement};

    fn role(sql: &str) -> Result<RoleStatement> {
        let p = parse(sql)?.remove(0);
        match p.statement {
            Statement::Role(r) => Ok(r),
            other => panic!("{sql}: {other:?}"),
        }
    }

    #[test]
    fn role_statements_read_as_postgresql_writes_them() {
        assert_eq!(
            role("CREATE USER app WITH PASSWORD 'pw' CONNECTION LIMIT 3").unwrap(),
            RoleStatement::Create {
                name: "app".into(),
                if_not_exists: false,
                spec: RoleSpec {
                    login: Some(true),
                    password: Some(Some("pw".into())),
                    connection_limit: Some(3),
                    ..RoleSpec::default()
                },
            }
        );
        assert_eq!(
            role("create role \"Ops\" superuser nologin").unwrap(),
            RoleStatement::Create {
                name: "Ops".into(),
                if_not_exists: false,
                spec: RoleSpec {
                    login: Some(false),
                    superuser: Some(true),
                    ..RoleSpec::default()
                },
            }
        );
        assert_eq!(
            role("ALTER USER app PASSWORD NULL").unwrap(),
            RoleStatement::Alter {
                name: "app".into(),
                spec: RoleSpec {
                    password: Some(None),
                    ..RoleSpec::default()
                },
            }
        );
        assert_eq!(
            role("DROP USER IF EXISTS a, b").unwrap(),
            RoleStatement::Drop {
                names: vec!["a".into(), "b".into()],
                if_exists: true,
            }
        );
        assert_eq!(
            role("CREATE ROLE pg_x").unwrap_err().kind,
            ErrorKind::ReservedName
        );
        assert_eq!(
            role("CREATE ROLE r VALID UNTIL '2030-01-01'")
                .unwrap_err()
                .kind,
            ErrorKind::NotSupported
        );
        assert_eq!(
            role("ALTER ROLE r CONNECTION LIMIT -2").unwrap_err().kind,
            ErrorKind::InvalidParameter
        );
        let RoleStatement::Alter { spec, .. } = role("ALTER ROLE r CONNECTION LIMIT -1").unwrap()
        else {
            panic!()
        };
        assert_eq!(spec.connection_limit, Some(-1));
    }
}
