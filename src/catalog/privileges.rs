//! Ownership, grants and role membership (`docs/design/0020-privileges.md`): who owns each
//! relation, what `GRANT` gave others on it and on the schema, which roles are members of
//! which, and the decision whether a role holds a privilege. Pure: the statements that change
//! them are `db/`'s, the checks' callers are where statements run.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::{Catalog, ObjectId, RoleDef, BOOTSTRAP_OID};
use crate::error::{Error, ErrorKind, Result};

/// The grantee that stands for every role (`PUBLIC`), as `aclitem` writes it: no name.
pub const PUBLIC: u32 = 0;

/// A privilege on a relation or on the schema, as PostgreSQL names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Privilege {
    Select,
    Insert,
    Update,
    Delete,
    Create,
    Usage,
}

impl Privilege {
    /// The privileges a relation may be granted (`ALL` on a relation).
    pub const RELATION: [Privilege; 4] = [
        Privilege::Insert,
        Privilege::Select,
        Privilege::Update,
        Privilege::Delete,
    ];
    /// The privileges the schema may be granted (`ALL` on a schema).
    pub const SCHEMA: [Privilege; 2] = [Privilege::Usage, Privilege::Create];

    fn bit(self) -> u8 {
        1 << self as u8
    }

    /// Its letter in an `aclitem` (`r` for SELECT, as PostgreSQL's "read").
    fn letter(self) -> char {
        match self {
            Privilege::Select => 'r',
            Privilege::Insert => 'a',
            Privilege::Update => 'w',
            Privilege::Delete => 'd',
            Privilege::Create => 'C',
            Privilege::Usage => 'U',
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Privilege::Select => "SELECT",
            Privilege::Insert => "INSERT",
            Privilege::Update => "UPDATE",
            Privilege::Delete => "DELETE",
            Privilege::Create => "CREATE",
            Privilege::Usage => "USAGE",
        }
    }
}

/// One grant, PostgreSQL's `aclitem`: what `grantor` gave `grantee` (`PUBLIC`: everyone).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AclItem {
    pub grantee: u32,
    pub grantor: u32,
    /// The privileges, one bit each (`Privilege::bit`).
    pub privileges: u8,
}

impl AclItem {
    pub fn holds(&self, p: Privilege) -> bool {
        self.privileges & p.bit() != 0
    }
}

/// A relation's owner and what was granted on it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Access {
    pub owner: u32,
    /// `None`: never granted or revoked, PostgreSQL's null ACL (the owner holds everything,
    /// no one else anything).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grants: Option<Vec<AclItem>>,
}

/// Relations created before Weir kept owners belong to the bootstrap superuser.
const DEFAULT_ACCESS: Access = Access {
    owner: BOOTSTRAP_OID,
    grants: None,
};

/// `GRANT role TO member`: `member` may use `role`'s privileges (when it inherits) and, with
/// `admin`, grant `role` to others.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Membership {
    pub role: u32,
    pub member: u32,
    pub grantor: u32,
    #[serde(default)]
    pub admin: bool,
}

/// The public schema's grants as PostgreSQL 15 creates them: its owner may use it and create
/// in it, everyone else may use it only.
pub fn default_schema_grants() -> Vec<AclItem> {
    vec![
        AclItem {
            grantee: BOOTSTRAP_OID,
            grantor: BOOTSTRAP_OID,
            privileges: Privilege::Usage.bit() | Privilege::Create.bit(),
        },
        AclItem {
            grantee: PUBLIC,
            grantor: BOOTSTRAP_OID,
            privileges: Privilege::Usage.bit(),
        },
    ]
}

/// The grants an owner holds on what it owns, as an ACL lists them once it is not null.
fn owner_item(owner: u32, privileges: &[Privilege]) -> AclItem {
    AclItem {
        grantee: owner,
        grantor: owner,
        privileges: privileges.iter().fold(0, |bits, p| bits | p.bit()),
    }
}

/// Adds (`grant`) or takes away privileges from `grantees` in an ACL (`None`: the null one,
/// which becomes its owner's full grant first, as in PostgreSQL). Only owners and superusers
/// grant, so every grant is the owner's, as PostgreSQL records a superuser's. Items left with
/// nothing go.
pub fn change_acl(
    acl: Option<Vec<AclItem>>,
    owner: u32,
    all: &[Privilege],
    change: (&[Privilege], &[u32]),
    grant: bool,
) -> Vec<AclItem> {
    let (privileges, grantees) = change;
    let mut acl = acl.unwrap_or_else(|| vec![owner_item(owner, all)]);
    let bits = privileges.iter().fold(0u8, |b, p| b | p.bit());
    for &grantee in grantees {
        match acl.iter_mut().find(|i| i.grantee == grantee) {
            Some(item) if grant => item.privileges |= bits,
            Some(item) => item.privileges &= !bits,
            None if grant => acl.push(AclItem {
                grantee,
                grantor: owner,
                privileges: bits,
            }),
            None => {}
        }
    }
    acl.retain(|i| i.privileges != 0);
    acl
}

/// An ACL in PostgreSQL's text form, one `aclitem` each: `name=letters/grantor`, PUBLIC with
/// no name.
pub fn acl_text(acl: &[AclItem], name: impl Fn(u32) -> String) -> Vec<String> {
    acl.iter()
        .map(|i| {
            let grantee = if i.grantee == PUBLIC {
                String::new()
            } else {
                name(i.grantee)
            };
            let letters: String = [
                Privilege::Insert,
                Privilege::Select,
                Privilege::Update,
                Privilege::Delete,
                Privilege::Usage,
                Privilege::Create,
            ]
            .iter()
            .filter(|p| i.holds(**p))
            .map(|p| p.letter())
            .collect();
            format!("{grantee}={letters}/{}", name(i.grantor))
        })
        .collect()
}

impl Catalog {
    /// Relation `id`'s owner and grants.
    pub fn access(&self, id: ObjectId) -> &Access {
        self.grants().access(id)
    }

    /// Records relations' owners and grants and saves the catalog; on failure the catalog is
    /// as before.
    pub fn set_access(&mut self, changed: Vec<(ObjectId, Access)>) -> Result<()> {
        let before = self.data.access.clone();
        self.data.access.extend(changed);
        self.save().inspect_err(|_| self.data.access = before)
    }

    /// The public schema's grants.
    pub fn schema_grants(&self) -> &[AclItem] {
        &self.data.schema_grants
    }

    pub fn set_schema_grants(&mut self, grants: Vec<AclItem>) -> Result<()> {
        let before = std::mem::replace(&mut self.data.schema_grants, grants);
        self.save()
            .inspect_err(|_| self.data.schema_grants = before)
    }

    pub fn memberships(&self) -> &[Membership] {
        &self.data.members
    }

    /// Replaces the memberships and saves the catalog; on failure the catalog is as before.
    pub fn set_memberships(&mut self, members: Vec<Membership>) -> Result<()> {
        let before = std::mem::replace(&mut self.data.members, members);
        self.save().inspect_err(|_| self.data.members = before)
    }

    /// The role of OID `oid`.
    pub fn role_by_oid(&self, oid: u32) -> Option<&RoleDef> {
        self.data.roles.iter().find(|r| r.oid == oid)
    }

    /// What deciding privileges reads, borrowed.
    pub fn grants(&self) -> Grants<'_> {
        Grants {
            roles: &self.data.roles,
            members: &self.data.members,
            access: &self.data.access,
            schema: &self.data.schema_grants,
        }
    }

    /// The roles whose privileges `role` has (`Grants::privileged_as`).
    pub fn privileged_as(&self, role: &RoleDef) -> BTreeSet<u32> {
        self.grants().privileged_as(role)
    }

    /// Whether `role` owns relation `id` (`Grants::owns`).
    pub fn owns(&self, role: &RoleDef, id: ObjectId) -> bool {
        self.grants().owns(role, id)
    }

    /// Whether `role` holds privilege `p` on relation `id` (`Grants::holds`).
    pub fn holds(&self, role: &RoleDef, id: ObjectId, p: Privilege) -> bool {
        self.grants().holds(role, id, p)
    }

    /// Whether `role` holds privilege `p` on the public schema.
    pub fn holds_on_schema(&self, role: &RoleDef, p: Privilege) -> bool {
        self.grants().holds_on_schema(role, p)
    }

    /// What keeps role `oid` from being dropped: the relations it owns and those it was
    /// granted privileges on (PostgreSQL's 2BP01 detail lines), and the schema.
    pub fn held_by(&self, oid: u32) -> Vec<String> {
        let mut lines = Vec::new();
        for o in &self.data.objects {
            let access = self.access(o.id());
            if access.owner == oid {
                lines.push(format!("owner of {} {}", o.kind_name(), o.name()));
            }
            let granted = access.grants.iter().flatten().any(|i| i.grantee == oid);
            if granted && access.owner != oid {
                lines.push(format!("privileges for {} {}", o.kind_name(), o.name()));
            }
        }
        for s in self.data.secrets.iter().filter(|s| s.owner == oid) {
            lines.push(format!("owner of secret {}", s.name));
        }
        if (self.data.schema_grants.iter()).any(|i| i.grantee == oid || i.grantor == oid) {
            lines.push("privileges for schema public".to_string());
        }
        lines
    }
}

/// What deciding privileges reads: the roles, their memberships, the relations' owners and
/// grants and the schema's grants, borrowed from the catalog or from a query's copy of them
/// (`pg_catalog`'s `has_table_privilege`).
#[derive(Debug, Clone, Copy)]
pub struct Grants<'a> {
    pub roles: &'a [RoleDef],
    pub members: &'a [Membership],
    pub access: &'a BTreeMap<ObjectId, Access>,
    pub schema: &'a [AclItem],
}

impl<'a> Grants<'a> {
    /// The roles whose privileges `role` has: itself, the roles it is a member of through
    /// roles that inherit (PostgreSQL's `has_privs_of_role`), and PUBLIC. Found by walking
    /// the membership graph without recursion; cycles are refused when granted.
    pub fn privileged_as(&self, role: &RoleDef) -> BTreeSet<u32> {
        let mut found = BTreeSet::from([PUBLIC, role.oid]);
        let mut frontier = vec![role.oid];
        while let Some(member) = frontier.pop() {
            let role = self.roles.iter().find(|r| r.oid == member);
            if !role.is_none_or(|r| r.inherit) {
                continue;
            }
            for m in self.members.iter().filter(|m| m.member == member) {
                if found.insert(m.role) {
                    frontier.push(m.role);
                }
            }
        }
        found
    }

    /// Relation `id`'s owner and grants: those it was created with until some are granted.
    fn access(&self, id: ObjectId) -> &'a Access {
        self.access.get(&id).unwrap_or(&DEFAULT_ACCESS)
    }

    /// Whether `role` owns relation `id`: it is a superuser, or has the owner's privileges.
    pub fn owns(&self, role: &RoleDef, id: ObjectId) -> bool {
        role.superuser || self.privileged_as(role).contains(&self.access(id).owner)
    }

    /// Whether `role` holds privilege `p` on relation `id`, and may use the schema it is in.
    pub fn holds(&self, role: &RoleDef, id: ObjectId, p: Privilege) -> bool {
        if role.superuser {
            return true;
        }
        let roles = self.privileged_as(role);
        let access = self.access(id);
        let granted = match &access.grants {
            None => roles.contains(&access.owner),
            Some(acl) => acl.iter().any(|i| roles.contains(&i.grantee) && i.holds(p)),
        };
        granted && self.holds_on_schema_as(&roles, Privilege::Usage)
    }

    /// Whether `role` holds privilege `p` on the public schema.
    pub fn holds_on_schema(&self, role: &RoleDef, p: Privilege) -> bool {
        role.superuser || self.holds_on_schema_as(&self.privileged_as(role), p)
    }

    fn holds_on_schema_as(&self, roles: &BTreeSet<u32>, p: Privilege) -> bool {
        (self.schema.iter()).any(|i| roles.contains(&i.grantee) && i.holds(p))
    }
}

/// Whether `member` is `role` or a member of it in `members`, directly or through others,
/// inheriting or not (PostgreSQL's `is_member_of_role`): what a cycle of grants would make
/// true. Walked without recursion.
pub fn is_member_of(members: &[Membership], member: u32, role: u32) -> bool {
    let mut seen = BTreeSet::from([member]);
    let mut frontier = vec![member];
    while let Some(m) = frontier.pop() {
        if m == role {
            return true;
        }
        for g in members.iter().filter(|g| g.member == m) {
            if seen.insert(g.role) {
                frontier.push(g.role);
            }
        }
    }
    false
}

/// 42501 for a statement that needs a privilege on a relation of kind `kind` named `name`, as
/// PostgreSQL words it.
pub fn denied(kind: &str, name: &str) -> Error {
    Error::new(
        ErrorKind::InsufficientPrivilege,
        format!("permission denied for {kind} {name}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_acl_reads_as_postgresql_writes_it() {
        let acl = change_acl(
            None,
            10,
            &Privilege::RELATION,
            (&[Privilege::Select], &[20, PUBLIC]),
            true,
        );
        let name = |oid: u32| {
            if oid == 10 {
                "weir".into()
            } else {
                format!("r{oid}")
            }
        };
        assert_eq!(
            acl_text(&acl, name),
            ["weir=arwd/weir", "r20=r/weir", "=r/weir"]
        );
        let acl = change_acl(
            Some(acl),
            10,
            &Privilege::RELATION,
            (&[Privilege::Select, Privilege::Insert], &[20]),
            false,
        );
        assert_eq!(acl_text(&acl, name), ["weir=arwd/weir", "=r/weir"]);
        assert_eq!(
            acl_text(&default_schema_grants(), name),
            ["weir=UC/weir", "=U/weir"]
        );
    }
}
