//! Who may do what to which relation (`docs/design/0020-privileges.md`): the checks a
//! statement makes before it runs, as the session's role, and `GRANT` and `REVOKE`. The
//! decisions are the catalog's (`catalog::privileges`); this module asks them and words the
//! refusals as PostgreSQL does.

use std::ops::ControlFlow;

use datafusion::common::TableReference;
use datafusion::sql::sqlparser::ast;

use crate::catalog::{
    change_acl, denied, is_member_of, Access, Membership, Object, Privilege, RoleDef, Scope,
    BOOTSTRAP_OID, PUBLIC,
};
use crate::error::{Error, ErrorKind, Result};
use crate::sql::{GrantOn, GrantStatement, Grantee, Settings};

use super::{Database, Output};

fn undefined_role(name: &str) -> Error {
    Error::new(
        ErrorKind::UndefinedObject,
        format!("role \"{name}\" does not exist"),
    )
}

fn schema_denied() -> Error {
    Error::new(
        ErrorKind::InsufficientPrivilege,
        "permission denied for schema public",
    )
}

/// 42501 for a statement only `object`'s owner may run (DROP).
pub(super) fn not_owner(object: &Object) -> Error {
    Error::new(
        ErrorKind::InsufficientPrivilege,
        format!("must be owner of {} {}", object.kind_name(), object.name()),
    )
}

/// The roles a statement acts as: the session's, or none for the server's own work (a view
/// started from the catalog), which is checked by nothing.
pub type Acting = Option<RoleDef>;

impl Database {
    /// The role `name`, which a session acts as, as the catalog holds it now; 42501 once it
    /// has been dropped.
    pub(super) fn acting(&self, name: &str) -> Result<RoleDef> {
        self.role(name).ok_or_else(|| {
            Error::new(
                ErrorKind::InsufficientPrivilege,
                format!("the session's role \"{name}\" no longer exists"),
            )
        })
    }

    /// The role a statement run with `settings` acts as.
    pub(super) fn acting_for(&self, settings: &Settings) -> Result<Acting> {
        (settings.backend.as_ref())
            .map(|b| self.acting(&b.start.user))
            .transpose()
    }

    /// Refuses (42501) unless `role` may create relations in the public schema.
    pub(super) fn check_create(&self, role: &RoleDef) -> Result<()> {
        if self.catalog().holds_on_schema(role, Privilege::Create) {
            return Ok(());
        }
        Err(schema_denied())
    }

    /// Refuses (42501) unless `role` holds `p` on each relation of the catalog that one of
    /// `references` names and `scope` sees (the system tables are everyone's to read).
    pub(super) fn check_references(
        &self,
        role: &Acting,
        references: &[TableReference],
        p: Privilege,
        scope: Scope,
    ) -> Result<()> {
        let catalog = self.catalog();
        let named = (references.iter())
            .filter(|r| r.schema().is_none_or(|s| s == "public"))
            .filter_map(|r| catalog.get(r.table(), scope));
        check_all(&catalog, role, named, p)
    }

    /// Refuses (42501) unless `role` holds `p` on `object`.
    pub(super) fn check_object(&self, role: &Acting, object: &Object, p: Privilege) -> Result<()> {
        check_all(&self.catalog(), role, [object], p)
    }

    /// Refuses a view (or sink) reading `inputs` unless `role`, its creator, may read them: a
    /// view reads its inputs with its owner's privileges, checked as it is created.
    pub(super) fn check_inputs(
        &self,
        role: &Acting,
        inputs: &[crate::catalog::ObjectId],
    ) -> Result<()> {
        let catalog = self.catalog();
        let objects = inputs.iter().filter_map(|id| catalog.by_id(*id));
        check_all(&catalog, role, objects, Privilege::Select)
    }

    /// Refuses a DML statement unless `role` holds its privilege on `target` (INSERT, UPDATE,
    /// DELETE), SELECT on the other relations it reads, and SELECT on `target` too where it
    /// reads the target's columns (a WHERE clause, a SET from columns), as PostgreSQL does.
    pub(super) fn check_dml(
        &self,
        role: &Acting,
        target: &Object,
        statement: &ast::Statement,
        references: &[TableReference],
        scope: Scope,
    ) -> Result<()> {
        let (p, reads_target) = match statement {
            ast::Statement::Insert(i) => (
                Privilege::Insert,
                (i.source.as_ref()).is_some_and(|q| names(q.as_ref(), target.name())),
            ),
            ast::Statement::Update(u) => {
                let values = u.assignments.iter().map(|a| &a.value);
                let exprs: Vec<&ast::Expr> = values.chain(u.selection.as_ref()).collect();
                (Privilege::Update, reads_columns(&exprs))
            }
            ast::Statement::Delete(d) => {
                let exprs: Vec<&ast::Expr> = d.selection.iter().collect();
                (Privilege::Delete, reads_columns(&exprs))
            }
            _ => return Err(Error::internal("a DML check for a statement not DML")),
        };
        self.check_object(role, target, p)?;
        if reads_target {
            self.check_object(role, target, Privilege::Select)?;
        }
        let others: Vec<TableReference> = (references.iter())
            .filter(|r| r.table() != target.name())
            .cloned()
            .collect();
        self.check_references(role, &others, Privilege::Select, scope)
    }

    /// Runs `GRANT` or `REVOKE` as the session's role `actor`.
    pub async fn grant_statement(&self, actor: &str, statement: &GrantStatement) -> Result<Output> {
        let _ddl = self.ddl.lock().await;
        let actor = self.acting(actor)?;
        match statement {
            GrantStatement::Privileges {
                grant,
                privileges,
                on,
                grantees,
            } => {
                let grantees = self.grantee_oids(&actor, grantees)?;
                self.grant_privileges(&actor, (*grant, privileges.as_deref()), on, &grantees)?;
            }
            GrantStatement::Roles {
                grant,
                roles,
                members,
                admin,
            } => {
                let members = self.grantee_oids(&actor, members)?;
                if members.contains(&PUBLIC) {
                    return Err(undefined_role("public"));
                }
                self.grant_roles(&actor, *grant, roles, (&members, *admin))?;
            }
        }
        Ok(Output::command(statement.tag()))
    }

    fn grantee_oids(&self, actor: &RoleDef, grantees: &[Grantee]) -> Result<Vec<u32>> {
        let catalog = self.catalog();
        (grantees.iter())
            .map(|g| match g {
                Grantee::Public => Ok(PUBLIC),
                Grantee::Current => Ok(actor.oid),
                Grantee::Role(name) => {
                    (catalog.role(name).map(|r| r.oid)).ok_or_else(|| undefined_role(name))
                }
            })
            .collect()
    }

    fn grant_privileges(
        &self,
        actor: &RoleDef,
        (grant, privileges): (bool, Option<&[Privilege]>),
        on: &GrantOn,
        grantees: &[u32],
    ) -> Result<()> {
        let mut catalog = self.catalog_mut();
        if let GrantOn::Schema = on {
            let owner = actor.superuser || catalog.privileged_as(actor).contains(&BOOTSTRAP_OID);
            if !owner {
                return Err(schema_denied());
            }
            let all = &Privilege::SCHEMA;
            let change = (privileges.unwrap_or(all), grantees);
            let acl = Some(catalog.schema_grants().to_vec());
            let acl = change_acl(acl, BOOTSTRAP_OID, all, change, grant);
            return catalog.set_schema_grants(acl);
        }
        let objects: Vec<Object> = match on {
            GrantOn::Relations(names) => (names.iter())
                .map(|name| {
                    (catalog.get(name, None).cloned())
                        .ok_or_else(|| crate::catalog::undefined_table(name))
                })
                .collect::<Result<_>>()?,
            _ => catalog.visible_objects(None).cloned().collect(),
        };
        let mut changed = Vec::new();
        for object in objects {
            if let Object::View(v) = &object {
                if v.sink {
                    if let GrantOn::AllInSchema = on {
                        continue;
                    }
                    return Err(Error::new(
                        ErrorKind::WrongObjectType,
                        format!("\"{}\" is a sink, which has no privileges", v.name),
                    ));
                }
            }
            if !catalog.owns(actor, object.id()) {
                return Err(denied(object.kind_name(), object.name()));
            }
            let access = catalog.access(object.id()).clone();
            let all = &Privilege::RELATION;
            let change = (privileges.unwrap_or(all), grantees);
            let grants = Some(change_acl(access.grants, access.owner, all, change, grant));
            changed.push((object.id(), Access { grants, ..access }));
        }
        catalog.set_access(changed)
    }

    fn grant_roles(
        &self,
        actor: &RoleDef,
        grant: bool,
        roles: &[String],
        (members, admin): (&[u32], bool),
    ) -> Result<()> {
        let mut catalog = self.catalog_mut();
        let mut all = catalog.memberships().to_vec();
        for name in roles {
            let role = catalog.role(name).ok_or_else(|| undefined_role(name))?;
            let admin_of = |m: &Membership| {
                m.role == role.oid && m.admin && is_member_of(&all, actor.oid, m.member)
            };
            let may = actor.superuser
                || (!role.superuser && (actor.create_role || all.iter().any(admin_of)));
            if !may {
                return Err(Error::new(
                    ErrorKind::InsufficientPrivilege,
                    format!("must have admin option on role \"{name}\""),
                ));
            }
            for &member in members {
                let found = (all.iter()).position(|m| m.role == role.oid && m.member == member);
                match (grant, found) {
                    (true, Some(i)) => all[i].admin |= admin,
                    (true, None) if is_member_of(&all, role.oid, member) => {
                        let member = catalog.role_by_oid(member).map(|r| r.name.clone());
                        return Err(Error::new(
                            ErrorKind::InvalidGrantOperation,
                            format!(
                                "role \"{name}\" is a member of role \"{}\"",
                                member.unwrap_or_default()
                            ),
                        ));
                    }
                    (true, None) => all.push(Membership {
                        role: role.oid,
                        member,
                        grantor: actor.oid,
                        admin,
                    }),
                    (false, Some(i)) if admin => all[i].admin = false,
                    (false, Some(i)) => {
                        all.remove(i);
                    }
                    (false, None) => {}
                }
            }
        }
        catalog.set_memberships(all)
    }
}

/// Whether a query names relation `name` anywhere in it.
fn names(query: &ast::Query, name: &str) -> bool {
    let found = ast::visit_relations(query, |r| match crate::sql::relation_name(r) {
        Ok(n) if n == name => ControlFlow::Break(()),
        _ => ControlFlow::Continue(()),
    });
    found.is_break()
}

/// Whether expressions name a column.
fn reads_columns(exprs: &[&ast::Expr]) -> bool {
    exprs.iter().any(|e| {
        ast::visit_expressions(*e, |e| match e {
            ast::Expr::Identifier(_) | ast::Expr::CompoundIdentifier(_) => ControlFlow::Break(()),
            _ => ControlFlow::Continue(()),
        })
        .is_break()
    })
}

/// Refuses (42501, naming the first) unless `role` holds `p` on each of `objects`; the
/// server's own work (no role) is checked by nothing.
fn check_all<'a>(
    catalog: &crate::catalog::Catalog,
    role: &Acting,
    objects: impl IntoIterator<Item = &'a Object>,
    p: Privilege,
) -> Result<()> {
    let Some(role) = role else {
        return Ok(());
    };
    match (objects.into_iter()).find(|o| !catalog.holds(role, o.id(), p)) {
        Some(o) => Err(denied(o.kind_name(), o.name())),
        None => Ok(()),
    }
}
