//! `CREATE`, `ALTER` and `DROP ROLE` (and `USER`): the catalog's roles changed as the
//! session's own role may change them, as in PostgreSQL
//! (`docs/design/0019-authentication.md`).

use crate::catalog::{RoleDef, Verifier, BOOTSTRAP_ROLE};
use crate::error::{Error, ErrorKind, Result};
use crate::sql::{RoleSpec, RoleStatement, STATEMENT_MEM};

use super::{Database, Output};

/// Relations' and roles' OIDs start here (PostgreSQL's first OID for user objects).
const FIRST_USER_OID: u32 = 16384;

fn denied(message: String, detail: &str) -> Error {
    Error::new(ErrorKind::InsufficientPrivilege, message).with_detail(detail)
}

fn undefined(name: &str) -> Error {
    Error::new(
        ErrorKind::UndefinedObject,
        format!("role \"{name}\" does not exist"),
    )
}

impl Database {
    /// Whether a role (a superuser or not) may use the server's files a new source's, table's
    /// or sink's connector names (`allowed_paths`; 42501 otherwise).
    pub(super) fn check_server_files(
        &self,
        connector: &crate::catalog::Connector,
        sink: bool,
        superuser: bool,
    ) -> Result<()> {
        let access = crate::connector::FileAccess {
            allowed: &self.config.allowed_paths,
            superuser,
        };
        crate::connector::check_server_files(connector, sink, &access)
    }

    /// Runs a role statement as the session's role `actor`.
    pub async fn role_statement(&self, actor: &str, statement: &RoleStatement) -> Result<Output> {
        let _ddl = self.ddl.lock().await;
        let actor = self.acting(actor)?;
        match statement {
            RoleStatement::Create {
                name,
                if_not_exists,
                spec,
            } => {
                if self.role(name).is_some() {
                    if *if_not_exists {
                        return Ok(Output::command("CREATE ROLE"));
                    }
                    return Err(Error::new(
                        ErrorKind::DuplicateNamed,
                        format!("role \"{name}\" already exists"),
                    ));
                }
                may_change(&actor, None, spec, "create")?;
                let id = self.catalog_mut().allocate_ids(1)[0];
                let mut role = RoleDef::new(FIRST_USER_OID.wrapping_add(id), name, false);
                apply(&mut role, spec)?;
                self.catalog_mut().put_role(role)?;
                Ok(Output::command("CREATE ROLE"))
            }
            RoleStatement::Alter { name, spec } => {
                let mut role = self.role(name).ok_or_else(|| undefined(name))?;
                let own_password = actor.name == *name
                    && *spec
                        == RoleSpec {
                            password: spec.password.clone(),
                            ..RoleSpec::default()
                        };
                if !own_password {
                    may_change(&actor, Some(&role), spec, "alter")?;
                }
                apply(&mut role, spec)?;
                if role.name == BOOTSTRAP_ROLE && !(role.superuser && role.login) {
                    return Err(denied(
                        format!("permission denied to alter role \"{name}\""),
                        "The bootstrap superuser keeps SUPERUSER and LOGIN.",
                    ));
                }
                self.catalog_mut().put_role(role)?;
                Ok(Output::command("ALTER ROLE"))
            }
            RoleStatement::Set {
                name,
                setting,
                value,
            } => {
                let mut role = self.role(name).ok_or_else(|| undefined(name))?;
                if actor.name != *name {
                    may_change(&actor, Some(&role), &RoleSpec::default(), "alter")?;
                }
                may_change_setting(&actor, &role, setting.as_deref())?;
                match (setting, value) {
                    (Some(setting), Some(value)) => {
                        match role.settings.iter_mut().find(|(k, _)| k == setting) {
                            Some((_, v)) => *v = value.clone(),
                            None => role.settings.push((setting.clone(), value.clone())),
                        }
                    }
                    (Some(setting), None) => role.settings.retain(|(k, _)| k != setting),
                    (None, _) => role.settings.clear(),
                }
                self.catalog_mut().put_role(role)?;
                Ok(Output::command("ALTER ROLE"))
            }
            RoleStatement::Drop { names, if_exists } => {
                let mut dropped = Vec::new();
                for name in names {
                    let Some(role) = self.role(name) else {
                        if *if_exists {
                            continue;
                        }
                        return Err(undefined(name));
                    };
                    if role.name == actor.name {
                        return Err(Error::new(
                            ErrorKind::ObjectInUse,
                            "current user cannot be dropped",
                        ));
                    }
                    if role.name == BOOTSTRAP_ROLE {
                        return Err(Error::new(
                            ErrorKind::ObjectInUse,
                            format!(
                                "cannot drop role {name} because it is required by the \
                                 database system"
                            ),
                        ));
                    }
                    may_change(&actor, Some(&role), &RoleSpec::default(), "drop")?;
                    let held = self.catalog().held_by(role.oid);
                    if !held.is_empty() {
                        return Err(Error::new(
                            ErrorKind::DependentObjects,
                            format!(
                                "role \"{name}\" cannot be dropped because some objects depend \
                                 on it"
                            ),
                        )
                        .with_detail(held.join("\n")));
                    }
                    dropped.push(role.name);
                }
                for name in dropped {
                    self.catalog_mut().remove_role(&name)?;
                }
                Ok(Output::command("DROP ROLE"))
            }
        }
    }
}

/// Whether `actor` may create (`target` `None`), alter or drop a role, giving it `spec`'s
/// attributes: a superuser may do anything; a role with CREATEROLE may do it to roles that
/// are not superusers, and give no SUPERUSER.
fn may_change(
    actor: &RoleDef,
    target: Option<&RoleDef>,
    spec: &RoleSpec,
    verb: &str,
) -> Result<()> {
    if actor.superuser {
        return Ok(());
    }
    let superuser = spec.superuser == Some(true) || target.is_some_and(|t| t.superuser);
    if superuser {
        return Err(denied(
            format!("permission denied to {verb} role"),
            &format!("Only roles with the SUPERUSER attribute may {verb} roles with the SUPERUSER attribute."),
        ));
    }
    if !actor.create_role {
        return Err(denied(
            format!("permission denied to {verb} role"),
            &format!("Only roles with the CREATEROLE attribute may {verb} roles."),
        ));
    }
    Ok(())
}

/// Whether `actor` may set or reset `role`'s `setting` (all of them: `None`). A role's
/// statement_mem bounds what its sessions may set: only a superuser gives, changes or takes it
/// away, as PostgreSQL keeps its superuser-only settings.
fn may_change_setting(actor: &RoleDef, role: &RoleDef, setting: Option<&str>) -> Result<()> {
    let touched = match setting {
        Some(s) => s == STATEMENT_MEM,
        None => role.settings.iter().any(|(k, _)| k == STATEMENT_MEM),
    };
    if touched && !actor.superuser {
        return Err(denied(
            format!("permission denied to set parameter \"{STATEMENT_MEM}\""),
            "Only superusers may set a role's statement_mem.",
        ));
    }
    Ok(())
}

/// Gives `role` the attributes `spec` sets; a password becomes its verifier.
fn apply(role: &mut RoleDef, spec: &RoleSpec) -> Result<()> {
    let set = |field: &mut bool, value: Option<bool>| {
        if let Some(v) = value {
            *field = v;
        }
    };
    set(&mut role.login, spec.login);
    set(&mut role.superuser, spec.superuser);
    set(&mut role.create_role, spec.create_role);
    set(&mut role.create_db, spec.create_db);
    set(&mut role.inherit, spec.inherit);
    if let Some(limit) = spec.connection_limit {
        role.connection_limit = limit;
    }
    match &spec.password {
        Some(Some(p)) if p.is_empty() => {
            // PostgreSQL: an empty password is no password.
            role.password = None;
        }
        Some(Some(p)) => role.password = Some(Verifier::of_statement(p)?),
        Some(None) => role.password = None,
        None => {}
    }
    Ok(())
}
