//! The boundary error: every module's failures reach the client as an `Error` with a coarse kind.
//!
//! Modules keep their own detail in the message; `server/` alone turns a kind into a SQLSTATE code
//! (see `server::sqlstate`), with an exhaustive match so that a new kind cannot compile without one.

use std::fmt;

/// What went wrong, as far as a client needs to know. Each kind maps to exactly one SQLSTATE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The statement does not parse.
    Syntax,
    /// The statement parses but cannot be planned (a semantic error without a more precise kind).
    Plan,
    /// Valid SQL that Weir does not support (yet), or cannot maintain incrementally.
    NotSupported,
    UndefinedTable,
    UndefinedColumn,
    UndefinedObject,
    UndefinedFunction,
    DuplicateObject,
    /// Two columns of one relation have the same name.
    DuplicateColumn,
    /// An object is of another kind than the statement needs (a table where a view is named).
    WrongObjectType,
    /// An object cannot be dropped because others depend on it.
    DependentObjects,
    /// An expression has the wrong type for where it is used.
    TypeMismatch,
    UniqueViolation,
    NotNullViolation,
    DivisionByZero,
    NumericOutOfRange,
    /// A date or time whose fields are numbers out of their range (22008): month 13.
    DatetimeFieldOverflow,
    /// Text that is not a date, time or interval (22007).
    InvalidDatetimeFormat,
    StringTooLong,
    /// A subquery used as an expression returned more than one row (21000).
    CardinalityViolation,
    /// A value's text cannot be read as its type.
    InvalidText,
    /// A value in binary form (a binary COPY's field) is not what its type's encoding is.
    InvalidBinary,
    /// Text that is not valid UTF-8 (22021).
    InvalidEncoding,
    /// COPY data that is not laid out as its format says (22P04): a line with too many or
    /// too few fields, an unterminated CSV quote, a binary COPY's bad signature.
    BadCopyFormat,
    /// A value is outside what the operation accepts (other than numeric range).
    InvalidParameter,
    /// A NULL where the operation needs a value (22004): `format('%I', NULL)`.
    NullValueNotAllowed,
    /// A file named in a statement (a file source's path) does not exist or cannot be read.
    UndefinedFile,
    /// A name that cannot be used as given (42602): a file sink's relative path, as
    /// PostgreSQL's COPY to a relative file.
    InvalidName,
    /// A name set aside for the system (42939): roles named `pg_...`.
    ReservedName,
    /// An object other than a relation (a role, a secret) of that name exists already
    /// (42710, PostgreSQL's `duplicate_object`).
    DuplicateNamed,
    /// The session's role may not do what it asked (42501).
    InsufficientPrivilege,
    /// A GRANT or REVOKE that cannot be done (0LP01): a privilege its object does not have, a
    /// membership that would make a cycle.
    InvalidGrantOperation,
    /// A setting fixed while the server runs (55P02): `SET server_version`.
    CantChangeRuntimeParam,
    /// An object is in use and cannot be changed so (55006): the session's own role dropped.
    ObjectInUse,
    /// A statement that cannot run inside a transaction block (25001).
    ActiveTransaction,
    /// A table's definition cannot be what the statement asks (a table fed by a database's
    /// changes without a primary key).
    InvalidTableDefinition,
    /// A column named where none fits (42P10): a sink that needs a key its view lacks.
    InvalidColumnReference,
    /// A parameter number (`$0`) that no statement can have.
    UndefinedParameter,
    /// A protocol message exceeds a configured limit, or a statement is too large.
    ProgramLimitExceeded,
    /// A statement's expressions or subqueries nest deeper than Weir's documented limit.
    StatementTooComplex,
    TooManyConnections,
    /// A client may not connect as it asked (no authentication admits it).
    InvalidAuthorization,
    /// A client's proof of who it is (its password) failed (28P01).
    InvalidPassword,
    /// A connection asked for a database other than Weir's one.
    UndefinedDatabase,
    /// A client's message could not be read as the protocol says it must be.
    ProtocolViolation,
    /// A query needs more working memory than the server's limit leaves it.
    OutOfMemory,
    /// A configured bound other than memory (53400): statements' temporary files past
    /// `temp_disk_limit`.
    ConfigurationLimitExceeded,
    /// The disk (or a quota) is full: nothing of the statement was kept.
    DiskFull,
    /// The process or the system has no file descriptor left.
    InsufficientResources,
    /// Reading or writing a file failed for another reason than space or descriptors.
    IoError,
    /// A statement was stopped before it finished (`statement_timeout`, a CancelRequest).
    QueryCanceled,
    /// The session was ended by `pg_terminate_backend` (57P01, sent as FATAL).
    AdminShutdown,
    /// An object is not in the state the operation needs: the checkpoint store has been taken
    /// over by another server.
    ObjectNotInPrerequisiteState,
    /// The server is shutting down or a component it needs is gone.
    Unavailable,
    /// An upstream system a connector reads (a Kafka broker) cannot be reached.
    ConnectionFailure,
    /// A statement that only a transaction block can run, outside one (25P01): DECLARE.
    NoActiveTransaction,
    /// A session idle in a transaction block past `idle_in_transaction_session_timeout`
    /// (25P03).
    IdleInTransactionTimeout,
    /// A cursor named that the session has not declared (34000).
    UndefinedCursor,
    /// A cursor declared under a name the session already has (42P03).
    DuplicateCursor,
    /// A statement in a transaction block after one of its statements failed: only ROLLBACK
    /// (or COMMIT, which rolls back) is run until the block ends.
    InFailedTransaction,
    /// A transaction block's COMMIT found a row it changed committed by another since the
    /// block began (first committer wins): nothing of it was applied; retry the block.
    SerializationFailure,
    /// A commit whose outcome cannot be told: it may be applied at the next start.
    TransactionResolutionUnknown,
    /// A write in a read-only transaction.
    ReadOnlySqlTransaction,
    /// Stored data failed a checksum or could not be decoded.
    DataCorruption,
    /// A bug: an invariant that should hold did not.
    Internal,
}

impl ErrorKind {
    /// A full disk, no descriptor left or a device error: the machine's fault, not the
    /// statement's, and over once it is fixed.
    pub fn is_io(self) -> bool {
        matches!(
            self,
            ErrorKind::DiskFull | ErrorKind::InsufficientResources | ErrorKind::IoError
        )
    }
}

/// A client-visible error in PostgreSQL's style: lower-case message without a final period;
/// detail and hint are sentences.
#[derive(Debug, Clone, PartialEq)]
pub struct Error {
    pub kind: ErrorKind,
    pub message: String,
    pub detail: Option<String>,
    pub hint: Option<String>,
    /// 1-based character position in the statement text, for syntax errors.
    pub position: Option<usize>,
    /// Where in the statement's input the error arose (PostgreSQL's CONTEXT): a COPY's line.
    pub context: Option<String>,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error {
            kind,
            message: message.into(),
            detail: None,
            hint: None,
            position: None,
            context: None,
        }
    }

    pub fn with_hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }

    pub fn with_detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = Some(detail.into());
        self
    }

    pub fn with_context(mut self, context: impl Into<String>) -> Self {
        self.context = Some(context.into());
        self
    }

    pub fn with_position(mut self, position: usize) -> Self {
        self.position = Some(position);
        self
    }

    pub fn syntax(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::Syntax, message)
    }

    pub fn plan(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::Plan, message)
    }

    pub fn not_supported(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::NotSupported, message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::Internal, message)
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::Unavailable, message)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)?;
        if let Some(detail) = &self.detail {
            write!(f, " ({detail})")?;
        }
        Ok(())
    }
}

impl std::error::Error for Error {}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::io(&e, format!("i/o error: {e}"))
    }
}

impl Error {
    /// An I/O failure, with the kind PostgreSQL gives its `errno`: a full disk or quota, no
    /// descriptor left, a device error; anything else (a closed channel, a refused
    /// connection) means a component is unavailable.
    pub fn io(e: &std::io::Error, message: impl Into<String>) -> Error {
        if let Some(ours) = Error::carried(e) {
            return ours;
        }
        match e.raw_os_error() {
            Some(libc::ENOSPC | libc::EDQUOT) => {
                Error::new(ErrorKind::DiskFull, message).with_hint("Check free disk space.")
            }
            Some(libc::EMFILE | libc::ENFILE) => {
                Error::new(ErrorKind::InsufficientResources, message).with_hint(
                    "Raise the server's open file limit (ulimit -n), or close connections.",
                )
            }
            Some(libc::EIO) => Error::new(ErrorKind::IoError, message),
            _ => Error::new(ErrorKind::Unavailable, message),
        }
    }
}

impl Error {
    /// Weir's own error, where `e` (or an error it came from) carries one: a library's I/O
    /// error of a writer Weir gave it (a temporary file past its budget).
    pub fn carried(e: &(dyn std::error::Error + 'static)) -> Option<Error> {
        let mut next = Some(e);
        while let Some(e) = next {
            let io = e
                .downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref());
            if let Some(ours) = io.and_then(|inner| inner.downcast_ref::<Error>()) {
                return Some(ours.clone());
            }
            next = e.source();
        }
        None
    }
}

impl From<datafusion::error::DataFusionError> for Error {
    fn from(e: datafusion::error::DataFusionError) -> Self {
        match Error::carried(&e) {
            Some(ours) => ours,
            None => from_datafusion(e),
        }
    }
}

impl From<datafusion::arrow::error::ArrowError> for Error {
    fn from(e: datafusion::arrow::error::ArrowError) -> Self {
        Error::carried(&e).unwrap_or_else(|| from_arrow(&e))
    }
}

fn from_arrow(e: &datafusion::arrow::error::ArrowError) -> Error {
    use datafusion::arrow::error::ArrowError as A;
    match e {
        A::DivideByZero => Error::new(ErrorKind::DivisionByZero, "division by zero"),
        A::ArithmeticOverflow(m) => Error::new(
            ErrorKind::NumericOutOfRange,
            format!("value out of range: {m}"),
        ),
        A::CastError(m) | A::ParseError(m) => {
            let lower = m.to_lowercase();
            // A number that does not fit the target type ("can't cast value 40000 to type
            // Int16"), as opposed to text that is not a number at all.
            if lower.contains("overflow")
                || lower.contains("too large")
                || lower.contains("out of range")
                || lower.contains("can't cast value")
            {
                Error::new(
                    ErrorKind::NumericOutOfRange,
                    format!("value out of range: {m}"),
                )
            } else {
                Error::new(ErrorKind::InvalidText, format!("invalid input: {m}"))
            }
        }
        A::ComputeError(m) if m.contains("Overflow") || m.contains("overflow") => Error::new(
            ErrorKind::NumericOutOfRange,
            format!("value out of range: {m}"),
        ),
        A::InvalidArgumentError(m) => Error::new(ErrorKind::InvalidParameter, m.clone()),
        other => Error::new(ErrorKind::InvalidParameter, other.to_string()),
    }
}

/// `DataFusionError` is not `Clone`; a shared one is re-created from what classifying it needs.
trait CloneForError {
    fn clone_for_error(&self) -> datafusion::error::DataFusionError;
}

impl CloneForError for datafusion::error::DataFusionError {
    fn clone_for_error(&self) -> datafusion::error::DataFusionError {
        use datafusion::error::DataFusionError as D;
        match self {
            D::Plan(m) => D::Plan(m.clone()),
            D::Execution(m) => D::Execution(m.clone()),
            D::NotImplemented(m) => D::NotImplemented(m.clone()),
            D::ResourcesExhausted(m) => D::ResourcesExhausted(m.clone()),
            D::Context(_, inner) | D::Diagnostic(_, inner) => inner.clone_for_error(),
            D::Shared(inner) => inner.clone_for_error(),
            D::ArrowError(a, c) => D::Execution(format!("{a} {}", c.clone().unwrap_or_default())),
            other => D::Internal(other.to_string()),
        }
    }
}

fn from_datafusion(e: datafusion::error::DataFusionError) -> Error {
    use datafusion::common::SchemaError;
    use datafusion::error::DataFusionError as D;
    match e {
        D::Context(_, inner) | D::Diagnostic(_, inner) => from_datafusion(*inner),
        D::Shared(inner) => from_datafusion(inner.as_ref().clone_for_error()),
        D::Collection(mut errors) if !errors.is_empty() => from_datafusion(errors.remove(0)),
        D::ArrowError(a, _) => from_arrow(&a),
        D::SQL(p, _) => Error::syntax(p.to_string()),
        D::NotImplemented(m) => Error::not_supported(m),
        D::SchemaError(s, _) => match *s {
            SchemaError::FieldNotFound { field, .. } => Error::new(
                ErrorKind::UndefinedColumn,
                format!("column \"{}\" does not exist", field.name),
            ),
            SchemaError::AmbiguousReference { field } => {
                Error::plan(format!("column reference \"{}\" is ambiguous", field.name))
            }
            other => Error::plan(other.to_string()),
        },
        D::Plan(m) => classify_plan_message(m),
        D::Execution(m) => {
            if m.contains("Scalar subquery returned more than one row") {
                Error::new(
                    ErrorKind::CardinalityViolation,
                    "more than one row returned by a subquery used as an expression",
                )
            } else if m.contains("Divide by zero") || m.contains("division by zero") {
                Error::new(ErrorKind::DivisionByZero, "division by zero")
            } else if m.contains("overflow") || m.contains("Overflow") {
                Error::new(ErrorKind::NumericOutOfRange, m)
            } else if m.contains("No function matches") {
                // A function's own argument check failing during type coercion.
                classify_plan_message(m)
            } else {
                Error::new(ErrorKind::InvalidParameter, m)
            }
        }
        D::Internal(m) => Error::internal(m),
        D::ResourcesExhausted(m) => Error::new(ErrorKind::OutOfMemory, m).with_hint(
            "Batch queries together may use half of memory_limit for their working memory; \
             this one needs more than is free.",
        ),
        D::External(inner) => match inner.downcast::<Error>() {
            Ok(ours) => *ours,
            Err(other) => match other.downcast::<D>() {
                Ok(datafusion) => from_datafusion(*datafusion),
                Err(other) => Error::internal(other.to_string()),
            },
        },
        other => Error::internal(other.to_string()),
    }
}

/// DataFusion reports most semantic errors as `Plan` with a message; sort the common ones
/// into the kinds a PostgreSQL client expects.
fn classify_plan_message(m: String) -> Error {
    let lower = m.to_lowercase();
    if lower.contains("table") && lower.contains("not found") {
        let name = m.split('\'').nth(1).unwrap_or("").to_string();
        let name = name.rsplit('.').next().unwrap_or("").to_string();
        return Error::new(
            ErrorKind::UndefinedTable,
            format!("relation \"{name}\" does not exist"),
        );
    }
    if lower.contains("unique expression names") {
        let name = m
            .split("expression \"")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .map(|n| n.rsplit('.').next().unwrap_or(n).to_string())
            .unwrap_or_default();
        return Error::new(
            ErrorKind::DuplicateColumn,
            format!("column \"{name}\" specified more than once"),
        )
        .with_hint("Give the columns distinct names with AS.");
    }
    if lower.contains("invalid function") || lower.contains("no function matches") {
        return Error::new(ErrorKind::UndefinedObject, m);
    }
    if lower.contains("zero is not a valid index") {
        return Error::new(ErrorKind::UndefinedParameter, "there is no parameter $0");
    }
    if lower.contains("cannot infer common")
        || lower.contains("coercion")
        || lower.contains("cannot be cast")
        || lower.contains("does not support")
        || lower.contains("type mismatch")
        || lower.contains("failed to coerce")
        || lower.contains("must be boolean")
        || lower.contains("there isn't a common type")
        || lower.contains("unsupported argument type")
        || lower.contains("non-boolean")
    {
        return Error::new(ErrorKind::TypeMismatch, m);
    }
    Error::plan(m)
}
