-- Set up CaseHub's two PostgreSQL roles: an owner that owns the database and its tables (migrations
-- run as it) and the application's role, which reads and writes every table but may only INSERT and
-- SELECT audit events. Idempotent; run it as a superuser, connected to the CaseHub database:
--
--   psql -h HOST -U postgres -d casehub -v ON_ERROR_STOP=1 \
--     -v owner=casehub_owner -v app=casehub_app \
--     -v owner_password=… -v app_password=… -f scripts/setup-postgres-roles.sql
--
-- The role names default to these two; the passwords are optional (leave them out where the server
-- trusts local users, and a later run without them keeps the ones set). Then migrate as the owner,
-- naming the application's role:
--
--   DATABASE_URL=postgres://casehub_owner:…@HOST/casehub CASEHUB_DB_APP_ROLE=casehub_app \
--     python manage.py migrate
--
-- and run CaseHub with DATABASE_URL=postgres://casehub_app:…@HOST/casehub.

\set ON_ERROR_STOP 1
\if :{?owner}
\else
  \set owner casehub_owner
\endif
\if :{?app}
\else
  \set app casehub_app
\endif

-- The roles (neither may create roles or databases, neither is a superuser).
SELECT format('CREATE ROLE %I', :'owner')
  WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = :'owner') \gexec
SELECT format('CREATE ROLE %I', :'app')
  WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = :'app') \gexec
SELECT format('ALTER ROLE %I LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOBYPASSRLS', :'owner') \gexec
SELECT format('ALTER ROLE %I LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOBYPASSRLS', :'app') \gexec
\if :{?owner_password}
  SELECT format('ALTER ROLE %I PASSWORD %L', :'owner', :'owner_password') \gexec
\endif
\if :{?app_password}
  SELECT format('ALTER ROLE %I PASSWORD %L', :'app', :'app_password') \gexec
\endif

-- The owner owns the database, its public schema and every table already in it.
SELECT format('ALTER DATABASE %I OWNER TO %I', current_database(), :'owner') \gexec
SELECT format('ALTER SCHEMA public OWNER TO %I', :'owner') \gexec
SELECT format('ALTER TABLE public.%I OWNER TO %I', tablename, :'owner')
  FROM pg_tables WHERE schemaname = 'public' \gexec
SELECT format('ALTER SEQUENCE public.%I OWNER TO %I', s.relname, :'owner')
  FROM pg_class s JOIN pg_namespace n ON n.oid = s.relnamespace
  WHERE n.nspname = 'public' AND s.relkind = 'S'
    AND NOT EXISTS (SELECT 1 FROM pg_depend d
                    WHERE d.objid = s.oid AND d.deptype IN ('a', 'i')) \gexec

-- Nobody else creates objects in the schema; the application's role uses it.
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
SELECT format('GRANT USAGE ON SCHEMA public TO %I', :'app') \gexec
SELECT format('GRANT CONNECT ON DATABASE %I TO %I', current_database(), :'app') \gexec

-- The application's role reads and writes every table, now and for the owner's future tables ...
SELECT format('GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO %I', :'app')
  \gexec
SELECT format('GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO %I', :'app') \gexec
SELECT format('ALTER DEFAULT PRIVILEGES FOR ROLE %I IN SCHEMA public'
              ' GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO %I', :'owner', :'app') \gexec
SELECT format('ALTER DEFAULT PRIVILEGES FOR ROLE %I IN SCHEMA public'
              ' GRANT USAGE, SELECT ON SEQUENCES TO %I', :'owner', :'app') \gexec

-- ... except the audit events, which it may only append and read (the migration that installs the
-- append-only triggers does the same when the table is created later).
SELECT format('REVOKE ALL ON public.oversight_auditevent FROM %I', :'app'),
       format('GRANT SELECT, INSERT ON public.oversight_auditevent TO %I', :'app')
  WHERE to_regclass('public.oversight_auditevent') IS NOT NULL \gexec
