"""SQLAlchemy 2 with psycopg2 against a running Weir server: the dialect connects (it probes
`pg_catalog.version()` and `pg_type`), the inspector reflects tables, materialized views,
columns with their types, and primary keys from pg_catalog, a table is reflected into a
`Table`, and the ORM inserts and selects.

Usage: python3 tests/drivers/sqlalchemy_test.py "postgresql+psycopg2://weir@127.0.0.1:4466/weir"
"""
import decimal
import sys

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column


def main(url):
    checks = 0
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        assert engine.dialect.server_version_info[:1] == (15,), engine.dialect.server_version_info
        conn.execute(sa.text(
            "CREATE TABLE sa_orders (id int PRIMARY KEY, customer varchar(40) NOT NULL,"
            " amount numeric(10,2), placed timestamptz)"))
        conn.execute(sa.text(
            "CREATE MATERIALIZED VIEW sa_revenue AS"
            " SELECT customer, sum(amount) AS total FROM sa_orders GROUP BY customer"))
        conn.commit()
    checks += 1

    inspector = sa.inspect(engine)
    assert "sa_orders" in inspector.get_table_names(), inspector.get_table_names()
    assert "sa_revenue" in inspector.get_materialized_view_names()
    assert inspector.has_table("sa_orders")
    columns = {c["name"]: c for c in inspector.get_columns("sa_orders")}
    assert list(columns) == ["id", "customer", "amount", "placed"], columns
    assert isinstance(columns["id"]["type"], sa.Integer), columns["id"]
    assert isinstance(columns["customer"]["type"], sa.String), columns["customer"]
    assert columns["customer"]["type"].length == 40, columns["customer"]
    assert not columns["customer"]["nullable"], columns["customer"]
    assert isinstance(columns["amount"]["type"], sa.Numeric), columns["amount"]
    assert (columns["amount"]["type"].precision, columns["amount"]["type"].scale) == (10, 2)
    assert inspector.get_pk_constraint("sa_orders")["constrained_columns"] == ["id"]
    view_columns = [c["name"] for c in inspector.get_columns("sa_revenue")]
    assert view_columns == ["customer", "total"], view_columns
    checks += 1

    # A table reflected from the catalog, and the ORM over it.
    reflected = sa.Table("sa_orders", sa.MetaData(), autoload_with=engine)
    assert [c.name for c in reflected.primary_key] == ["id"]

    class Base(DeclarativeBase):
        pass

    class Order(Base):
        __tablename__ = "sa_orders"
        id: Mapped[int] = mapped_column(primary_key=True)
        customer: Mapped[str]
        amount: Mapped[decimal.Decimal]

    with Session(engine) as session:
        session.add_all([Order(id=i, customer=f"c{i % 3}", amount=decimal.Decimal(i))
                         for i in range(1, 31)])
        session.commit()
    with Session(engine) as session:
        assert session.get(Order, 7).customer == "c1"
        rows = session.execute(
            sa.select(Order.customer, sa.func.count()).group_by(Order.customer)
            .order_by(Order.customer)).all()
        assert rows == [("c0", 10), ("c1", 10), ("c2", 10)], rows
        session.execute(sa.text("FLUSH"))
        total = session.execute(sa.text(
            "SELECT total FROM sa_revenue WHERE customer = :c"), {"c": "c0"}).scalar_one()
        assert total == sum(decimal.Decimal(i) for i in range(3, 31, 3)), total
    checks += 1

    # An error, and the engine goes on.
    with engine.connect() as conn:
        try:
            conn.execute(sa.text("INSERT INTO sa_orders (id, customer) VALUES (1, 'x')"))
            raise AssertionError("a duplicate key was accepted")
        except sa.exc.IntegrityError:
            conn.rollback()
        assert conn.execute(sa.text("SELECT count(*) FROM sa_orders")).scalar_one() == 30
    checks += 1
    print(f"sqlalchemy: {checks} passed, 0 failed")


if __name__ == "__main__":
    main(sys.argv[1])
