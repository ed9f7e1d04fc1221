package pgembed

// A row if database $1 exists. (CREATE DATABASE takes no parameters: its name is quoted with
// pgx.Identifier where it runs.)
const sqlDatabaseExists = `SELECT 1 FROM pg_database WHERE datname = $1`
