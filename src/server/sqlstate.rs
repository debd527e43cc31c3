//! SQLSTATE codes for error kinds: one code per kind, no wildcard arm.

use crate::error::ErrorKind;

pub fn sqlstate(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::Syntax => "42601",
        ErrorKind::Plan => "42000",
        ErrorKind::NotSupported => "0A000",
        ErrorKind::UndefinedTable => "42P01",
        ErrorKind::UndefinedColumn => "42703",
        ErrorKind::UndefinedObject => "42704",
        ErrorKind::UndefinedFunction => "42883",
        ErrorKind::DuplicateObject => "42P07",
        ErrorKind::DuplicateColumn => "42701",
        ErrorKind::WrongObjectType => "42809",
        ErrorKind::DependentObjects => "2BP01",
        ErrorKind::TypeMismatch => "42804",
        ErrorKind::UniqueViolation => "23505",
        ErrorKind::NotNullViolation => "23502",
        ErrorKind::DivisionByZero => "22012",
        ErrorKind::NumericOutOfRange => "22003",
        ErrorKind::StringTooLong => "22001",
        ErrorKind::InvalidText => "22P02",
        ErrorKind::InvalidParameter => "22023",
        ErrorKind::UndefinedFile => "58P01",
        ErrorKind::UndefinedParameter => "42P02",
        ErrorKind::ProgramLimitExceeded => "54000",
        ErrorKind::StatementTooComplex => "54001",
        ErrorKind::TooManyConnections => "53300",
        ErrorKind::InvalidAuthorization => "28000",
        ErrorKind::UndefinedDatabase => "3D000",
        ErrorKind::ProtocolViolation => "08P01",
        ErrorKind::OutOfMemory => "53200",
        ErrorKind::DiskFull => "53100",
        ErrorKind::InsufficientResources => "53000",
        ErrorKind::IoError => "58030",
        ErrorKind::QueryCanceled => "57014",
        ErrorKind::ObjectNotInPrerequisiteState => "55000",
        ErrorKind::Unavailable => "57P03",
        ErrorKind::DataCorruption => "XX001",
        ErrorKind::Internal => "XX000",
    }
}
