//! `GRANT` and `REVOKE` read into what they ask (`docs/design/0020-privileges.md`):
//! privileges on relations or on the public schema, or membership in roles.

use datafusion::sql::sqlparser::ast;
use datafusion::sql::sqlparser::tokenizer::{Token, TokenWithSpan};

use super::ddl::ident_name;
use crate::catalog::Privilege;
use crate::error::{Error, Result};

/// Who a grant is for: a role by name, or every role (`PUBLIC`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Grantee {
    Public,
    Role(String),
    /// `CURRENT_USER`, `CURRENT_ROLE` or `SESSION_USER`: the session's role.
    Current,
}

/// What privileges are granted on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GrantOn {
    Relations(Vec<String>),
    /// `ALL TABLES IN SCHEMA public`: every relation there now.
    AllInSchema,
    Schema,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GrantStatement {
    /// `GRANT privileges ON ... TO grantees`, or (`grant` false) `REVOKE ... FROM`;
    /// `privileges` `None`: `ALL`.
    Privileges {
        grant: bool,
        privileges: Option<Vec<Privilege>>,
        on: GrantOn,
        grantees: Vec<Grantee>,
    },
    /// `GRANT roles TO members [WITH ADMIN OPTION]`, or `REVOKE [ADMIN OPTION FOR] roles
    /// FROM members` (`admin`: only the admin option goes).
    Roles {
        grant: bool,
        roles: Vec<String>,
        members: Vec<Grantee>,
        admin: bool,
    },
}

impl GrantStatement {
    /// The command tag, and what a read-only transaction refuses.
    pub fn tag(&self) -> &'static str {
        match self {
            GrantStatement::Privileges { grant: true, .. }
            | GrantStatement::Roles { grant: true, .. } => "GRANT",
            _ => "REVOKE",
        }
    }
}

fn unsupported(what: &str) -> Error {
    Error::not_supported(format!("{what} is not supported"))
}

fn grantee(g: &ast::Grantee) -> Result<Grantee> {
    match (&g.grantee_type, &g.name) {
        (ast::GranteesType::Public, _) => Ok(Grantee::Public),
        (ast::GranteesType::None, Some(ast::GranteeName::ObjectName(n))) => {
            Ok(named(super::relation_name(n)?))
        }
        _ => Err(unsupported(&format!("grantee {g}"))),
    }
}

/// A grantee by its name, as PostgreSQL reads a role specification.
fn named(name: String) -> Grantee {
    match name.as_str() {
        "public" => Grantee::Public,
        "current_user" | "current_role" | "session_user" => Grantee::Current,
        _ => Grantee::Role(name),
    }
}

fn privilege(action: &ast::Action) -> Result<Privilege> {
    let whole = |columns: &Option<Vec<ast::Ident>>, p: Privilege| match columns {
        None => Ok(p),
        Some(_) => Err(unsupported("column privileges")),
    };
    match action {
        ast::Action::Select { columns } => whole(columns, Privilege::Select),
        ast::Action::Insert { columns } => whole(columns, Privilege::Insert),
        ast::Action::Update { columns } => whole(columns, Privilege::Update),
        ast::Action::Delete => Ok(Privilege::Delete),
        ast::Action::Create { obj_type: None } => Ok(Privilege::Create),
        ast::Action::Usage => Ok(Privilege::Usage),
        other => Err(unsupported(&format!("privilege {other}"))),
    }
}

fn public_schema(schemas: &[ast::ObjectName]) -> Result<()> {
    for s in schemas {
        let name = s.to_string();
        if !name.eq_ignore_ascii_case("public") {
            return Err(Error::new(
                crate::error::ErrorKind::UndefinedObject,
                format!("schema \"{name}\" does not exist"),
            ));
        }
    }
    Ok(())
}

/// The privileges form, as sqlparser reads it.
fn privileges(
    grant: bool,
    privileges: &ast::Privileges,
    objects: Option<&ast::GrantObjects>,
    grantees: &[ast::Grantee],
) -> Result<GrantStatement> {
    let privileges = match privileges {
        ast::Privileges::All { .. } => None,
        ast::Privileges::Actions(actions) => {
            Some(actions.iter().map(privilege).collect::<Result<Vec<_>>>()?)
        }
    };
    let on = match objects {
        Some(ast::GrantObjects::Tables(names)) => GrantOn::Relations(
            (names.iter())
                .map(super::relation_name)
                .collect::<Result<_>>()?,
        ),
        Some(
            ast::GrantObjects::AllTablesInSchema { schemas }
            | ast::GrantObjects::AllMaterializedViewsInSchema { schemas },
        ) => {
            public_schema(schemas)?;
            GrantOn::AllInSchema
        }
        Some(ast::GrantObjects::Schemas(schemas)) => {
            public_schema(schemas)?;
            GrantOn::Schema
        }
        Some(other) => return Err(unsupported(&format!("GRANT ON {other}"))),
        None => return Err(Error::syntax("GRANT and REVOKE of privileges need ON")),
    };
    let relation = matches!(on, GrantOn::Relations(_) | GrantOn::AllInSchema);
    let valid: &[Privilege] = if relation {
        &Privilege::RELATION
    } else {
        &Privilege::SCHEMA
    };
    if let Some(p) = privileges.iter().flatten().find(|p| !valid.contains(p)) {
        let on = if relation { "relation" } else { "schema" };
        return Err(Error::new(
            crate::error::ErrorKind::InvalidGrantOperation,
            format!("invalid privilege type {} for {on}", p.name()),
        ));
    }
    Ok(GrantStatement::Privileges {
        grant,
        privileges,
        on,
        grantees: grantees.iter().map(grantee).collect::<Result<_>>()?,
    })
}

/// `GRANT` or `REVOKE` of privileges, as sqlparser parsed it.
pub fn grant(g: &ast::Grant) -> Result<GrantStatement> {
    if g.with_grant_option {
        return Err(unsupported("WITH GRANT OPTION"));
    }
    if g.granted_by.is_some() || g.as_grantor.is_some() {
        return Err(unsupported("GRANTED BY"));
    }
    privileges(true, &g.privileges, g.objects.as_ref(), &g.grantees)
}

pub fn revoke(r: &ast::Revoke) -> Result<GrantStatement> {
    if r.granted_by.is_some() {
        return Err(unsupported("GRANTED BY"));
    }
    // Without grant options no grant depends on another: CASCADE has nothing to follow.
    privileges(false, &r.privileges, r.objects.as_ref(), &r.grantees)
}

/// A statement of `GRANT` or `REVOKE` without `ON`: membership in roles, which sqlparser
/// does not read. `None` when the tokens are not one (the privileges form).
pub fn membership(tokens: &[TokenWithSpan]) -> Option<Result<GrantStatement>> {
    let words: Vec<&Token> = tokens
        .iter()
        .map(|t| &t.token)
        .filter(|t| !matches!(t, Token::Whitespace(_)))
        .collect();
    let keyword = |t: &Token, k: &str| matches!(t, Token::Word(w) if w.quote_style.is_none() && w.value.eq_ignore_ascii_case(k));
    let grant = keyword(words.first()?, "grant");
    if !grant && !keyword(words.first()?, "revoke") {
        return None;
    }
    if words.iter().any(|t| keyword(t, "on")) {
        return None;
    }
    Some(read_membership(&words[1..], grant, &keyword))
}

fn read_membership(
    mut words: &[&Token],
    grant: bool,
    keyword: &dyn Fn(&Token, &str) -> bool,
) -> Result<GrantStatement> {
    let syntax = || {
        Error::syntax(format!(
            "syntax error in {}",
            if grant { "GRANT" } else { "REVOKE" }
        ))
    };
    let mut admin = false;
    if !grant && words.len() >= 3 && keyword(words[0], "admin") && keyword(words[1], "option") {
        if !keyword(words[2], "for") {
            return Err(syntax());
        }
        admin = true;
        words = &words[3..];
    }
    // A comma-separated list of names, up to `until`.
    let names = |words: &mut &[&Token], until: &str| -> Result<Vec<String>> {
        let mut out = Vec::new();
        loop {
            match words.first() {
                Some(Token::Word(w))
                    if !(w.quote_style.is_none() && w.value.eq_ignore_ascii_case(until)) =>
                {
                    out.push(ident_name(&ast::Ident {
                        value: w.value.clone(),
                        quote_style: w.quote_style,
                        span: datafusion::sql::sqlparser::tokenizer::Span::empty(),
                    }));
                    *words = &words[1..];
                }
                _ => return Err(syntax()),
            }
            match words.first() {
                Some(Token::Comma) => *words = &words[1..],
                _ => return Ok(out),
            }
        }
    };
    let roles = names(&mut words, if grant { "to" } else { "from" })?;
    let to = if grant { "to" } else { "from" };
    if !words.first().is_some_and(|t| keyword(t, to)) {
        return Err(syntax());
    }
    words = &words[1..];
    let members = names(&mut words, "with")?.into_iter().map(named).collect();
    match words {
        [] => {}
        [w, a, o] if grant && keyword(w, "with") && keyword(a, "admin") && keyword(o, "option") => {
            admin = true
        }
        [c] if !grant && (keyword(c, "cascade") || keyword(c, "restrict")) => {}
        _ => return Err(syntax()),
    }
    Ok(GrantStatement::Roles {
        grant,
        roles,
        members,
        admin,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sql::parser::{parse, Statement};

    fn read(sql: &str) -> Result<GrantStatement> {
        match parse(sql)?.remove(0).statement {
            Statement::Grant(g) => Ok(g),
            other => panic!("{sql}: {other:?}"),
        }
    }

    #[test]
    fn grants_read_as_postgresql_writes_them() {
        assert_eq!(
            read("GRANT SELECT, INSERT ON TABLE t, public.v TO alice, PUBLIC").unwrap(),
            GrantStatement::Privileges {
                grant: true,
                privileges: Some(vec![Privilege::Select, Privilege::Insert]),
                on: GrantOn::Relations(vec!["t".into(), "v".into()]),
                grantees: vec![Grantee::Role("alice".into()), Grantee::Public],
            }
        );
        assert_eq!(
            read("revoke all privileges on all tables in schema public from \"Bob\"").unwrap(),
            GrantStatement::Privileges {
                grant: false,
                privileges: None,
                on: GrantOn::AllInSchema,
                grantees: vec![Grantee::Role("Bob".into())],
            }
        );
        assert_eq!(
            read("GRANT CREATE ON SCHEMA public TO current_user").unwrap(),
            GrantStatement::Privileges {
                grant: true,
                privileges: Some(vec![Privilege::Create]),
                on: GrantOn::Schema,
                grantees: vec![Grantee::Current],
            }
        );
        assert_eq!(
            read("GRANT readers, \"Writers\" TO alice WITH ADMIN OPTION").unwrap(),
            GrantStatement::Roles {
                grant: true,
                roles: vec!["readers".into(), "Writers".into()],
                members: vec![Grantee::Role("alice".into())],
                admin: true,
            }
        );
        assert_eq!(
            read("REVOKE ADMIN OPTION FOR readers FROM alice CASCADE").unwrap(),
            GrantStatement::Roles {
                grant: false,
                roles: vec!["readers".into()],
                members: vec![Grantee::Role("alice".into())],
                admin: true,
            }
        );
        assert_eq!(
            read("GRANT SELECT ON t TO PUBLIC, alice").unwrap(),
            GrantStatement::Privileges {
                grant: true,
                privileges: Some(vec![Privilege::Select]),
                on: GrantOn::Relations(vec!["t".into()]),
                grantees: vec![Grantee::Public, Grantee::Role("alice".into())],
            }
        );
        use crate::error::ErrorKind as K;
        for (sql, kind) in [
            ("GRANT CREATE ON t TO a", K::InvalidGrantOperation),
            (
                "GRANT SELECT ON SCHEMA public TO a",
                K::InvalidGrantOperation,
            ),
            ("GRANT SELECT ON SCHEMA other TO a", K::UndefinedObject),
            ("GRANT SELECT (x) ON t TO a", K::NotSupported),
            ("GRANT SELECT ON t TO a WITH GRANT OPTION", K::NotSupported),
            ("GRANT r TO", K::Syntax),
            ("GRANT r TO a WITH", K::Syntax),
        ] {
            assert_eq!(read(sql).map(|_| ()).unwrap_err().kind, kind, "{sql}");
        }
    }
}
