package config

import (
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"unicode"

	"github.com/BurntSushi/toml"
)

// Overrides carries what came from flags and where the config file is. A nil pointer means "flag not given".
type Overrides struct {
	ConfigFile  string  // --config; "" means DefaultFile if it exists in the working directory, else none
	DatabaseURL *string // --database-url
	NodeID      *string // --node-id
	Roles       *string // --roles, comma-separated
	Listen      *string // --listen
	StateDir    *string // --state-dir
	NixStore    *string // --nix-store
}

// origins maps a dotted key to the env variable or flag that set it, so that
// Validate's messages can point at the real culprit.
type origins map[string]string

// Load builds the configuration: Default(), then the TOML file, then
// environment (through getenv), then Overrides, then reads token files, then
// Validate. getenv is os.Getenv in production; tests pass a map lookup.
//
// Token and validation problems are reported together; file problems
// (unreadable, syntax, unknown keys, wrong types) stop Load before that.
func Load(o Overrides, getenv func(string) string) (*Config, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	c := defaults(getenv)
	if err := c.loadFile(o.ConfigFile); err != nil {
		return nil, err
	}
	from := origins{}
	c.applyEnv(getenv, from)
	c.applyOverrides(o, from)
	// Relative to where the command runs, once: git, Nix and PostgreSQL get absolute paths.
	if c.StateDir != "" && !filepath.IsAbs(c.StateDir) {
		if abs, err := filepath.Abs(c.StateDir); err == nil {
			c.StateDir = abs
		}
	}
	errs := c.readTokens(getenv)
	errs = append(errs, c.problems(from)...)
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return c, nil
}

func (c *Config) loadFile(path string) error {
	explicit := path != ""
	if !explicit {
		path = filepath.Join(defaultFileDir, DefaultFile)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		if !explicit && errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("config %s: %w", path, err)
	}
	if err := decodeFile(string(data), c); err != nil {
		return prefixErrors("config "+path+": ", err)
	}
	// A database password in a file others can read is a secret in the open.
	if hasPassword(c.DatabaseURL) {
		if err := checkSecretFile(path); err != nil {
			return fmt.Errorf("config %s: database_url holds a password: %w (or give the URL in HARMONIA_DATABASE_URL)", path, err)
		}
	}
	c.Source = path
	return nil
}

// hasPassword reports whether a PostgreSQL URL or key=value DSN carries a password.
func hasPassword(dsn string) bool {
	if u, err := url.Parse(dsn); err == nil && u.User != nil {
		if _, ok := u.User.Password(); ok {
			return true
		}
	}
	if strings.Contains(dsn, "password=") {
		return true
	}
	return false
}

// decodeFile decodes TOML text over c. The text is first decoded generically
// and checked against Config's shape: BurntSushi stops at the first bad value
// and names keys in its own format, while this reports every unknown key and
// every wrongly typed or malformed value, each under its dotted key.
func decodeFile(text string, c *Config) error {
	var raw map[string]any
	md, err := toml.Decode(text, &raw)
	if err != nil {
		return tomlError(err)
	}
	order := make(map[string]int, len(md.Keys()))
	for i, k := range md.Keys() {
		order[k.String()] = i
	}
	var ck checker
	ck.order = order
	ck.table(raw, reflect.TypeFor[Config](), nil)
	if len(ck.unknown) > 0 {
		ck.problems = append([]error{unknownKeys(ck.unknown)}, ck.problems...)
	}
	if len(ck.problems) > 0 {
		return errors.Join(ck.problems...)
	}

	md, err = toml.Decode(text, c)
	if err != nil {
		return tomlError(err) // not expected after the check above
	}
	// Cross-check with the decoder's own view, in case it and checker disagree.
	if und := md.Undecoded(); len(und) > 0 {
		keys := make([]string, len(und))
		for i, k := range und {
			keys[i] = k.String()
		}
		return unknownKeys(keys)
	}
	return nil
}

func tomlError(err error) error {
	return errors.New(strings.TrimPrefix(err.Error(), "toml: "))
}

// renamed explains keys that were replaced, so an old configuration fails with the way forward.
var renamed = map[string]string{
	"auth.cluster_token_file": "auth.cluster_token_file was replaced: signer nodes hold auth.cluster_secret_file, every other node its own auth.node_token_file (harmonia-ci node-token)",
}

func unknownKeys(keys []string) error {
	q := make([]string, len(keys))
	for i, k := range keys {
		q[i] = fmt.Sprintf("%q", k)
		if hint, ok := renamed[k]; ok {
			q[i] += " (" + hint + ")"
		}
	}
	if len(q) == 1 {
		return fmt.Errorf("unknown key %s", q[0])
	}
	return fmt.Errorf("unknown keys %s", strings.Join(q, ", "))
}

// prefixErrors puts prefix before each error of a join, so that every line of
// the final message says where it comes from.
func prefixErrors(prefix string, err error) error {
	var errs []error
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	} else {
		errs = []error{err}
	}
	out := make([]error, len(errs))
	for i, e := range errs {
		out[i] = fmt.Errorf("%s%w", prefix, e)
	}
	return errors.Join(out...)
}

var (
	durationType = reflect.TypeFor[Duration]()
	byteSizeType = reflect.TypeFor[ByteSize]()
)

// checker walks a generically decoded TOML table alongside the struct type it
// will be decoded into.
type checker struct {
	order    map[string]int // dotted key -> position in the file
	unknown  []string
	problems []error
}

func (ck *checker) table(tbl map[string]any, t reflect.Type, path toml.Key) {
	fields := map[string]reflect.StructField{}
	for _, f := range reflect.VisibleFields(t) {
		name, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
		if f.IsExported() && name != "" && name != "-" {
			fields[name] = f
		}
	}
	keys := make([]string, 0, len(tbl))
	for k := range tbl {
		keys = append(keys, k)
	}
	// File order reads best; implicit tables are not in md.Keys, so fall back to names.
	sort.Slice(keys, func(i, j int) bool {
		oi, iok := ck.order[ckey(path, keys[i])]
		oj, jok := ck.order[ckey(path, keys[j])]
		if iok && jok && oi != oj {
			return oi < oj
		}
		if iok != jok {
			return iok
		}
		return keys[i] < keys[j]
	})
	for _, k := range keys {
		key := append(path[:len(path):len(path)], k)
		f, ok := fields[k]
		if !ok {
			ck.unknown = append(ck.unknown, key.String())
			continue
		}
		ck.value(tbl[k], f.Type, key)
	}
}

func ckey(path toml.Key, k string) string {
	return append(path[:len(path):len(path)], k).String()
}

func (ck *checker) value(v any, t reflect.Type, key toml.Key) {
	bad := func(want string) {
		ck.problems = append(ck.problems, fmt.Errorf("%s: expected %s, got %s", key, want, describe(v)))
	}
	if t == durationType || t == byteSizeType {
		u := reflect.New(t).Interface().(toml.Unmarshaler)
		if err := u.UnmarshalTOML(v); err != nil {
			ck.problems = append(ck.problems, fmt.Errorf("%s: %w", key, err))
		}
		return
	}
	switch t.Kind() {
	case reflect.Struct:
		if m, ok := v.(map[string]any); ok {
			ck.table(m, t, key)
		} else {
			bad("table")
		}
	case reflect.String:
		if _, ok := v.(string); !ok {
			bad("string")
		}
	case reflect.Bool:
		if _, ok := v.(bool); !ok {
			bad("true or false")
		}
	case reflect.Int:
		if i, ok := v.(int64); !ok || int64(int(i)) != i {
			bad("integer")
		}
	case reflect.Slice:
		if t.Elem().Kind() == reflect.Struct {
			// An array of tables ([[forges]]).
			tables, ok := v.([]map[string]any)
			if arr, isArr := v.([]any); isArr && len(arr) == 0 {
				return // forges = [], as an encoded default says
			}
			if !ok {
				bad("array of tables")
				return
			}
			for i, tbl := range tables {
				ck.table(tbl, t.Elem(), toml.Key{fmt.Sprintf("%s[%d]", key, i)})
			}
			return
		}
		arr, ok := v.([]any)
		if !ok || t.Elem().Kind() != reflect.String {
			bad("array of strings")
			return
		}
		for i, e := range arr {
			if _, ok := e.(string); !ok {
				ck.problems = append(ck.problems, fmt.Errorf("%s[%d]: expected string, got %s", key, i, describe(e)))
			}
		}
	default:
		// A field type this checker does not know: a bug here, not in the file.
		panic(fmt.Sprintf("config: unsupported field type %s for %s", t, key))
	}
}

// applyEnv applies the HARMONIA_* variables; an empty variable counts as unset.
func (c *Config) applyEnv(getenv func(string) string, from origins) {
	set := func(dst *string, env, key string) {
		if v := getenv(env); v != "" {
			*dst = v
			from[key] = env
		}
	}
	set(&c.DatabaseURL, "HARMONIA_DATABASE_URL", "database_url")
	set(&c.StateDir, "HARMONIA_STATE_DIR", "state_dir")
	set(&c.LogLevel, "HARMONIA_LOG_LEVEL", "log_level")
	set(&c.Node.ID, "HARMONIA_NODE_ID", "node.id")
	set(&c.Build.NixStore, "HARMONIA_NIX_STORE", "build.nix_store")
}

func (c *Config) applyOverrides(o Overrides, from origins) {
	set := func(dst, v *string, flag, key string) {
		if v != nil {
			*dst = *v
			from[key] = flag
		}
	}
	set(&c.DatabaseURL, o.DatabaseURL, "--database-url", "database_url")
	set(&c.Node.ID, o.NodeID, "--node-id", "node.id")
	set(&c.Listen, o.Listen, "--listen", "listen")
	set(&c.StateDir, o.StateDir, "--state-dir", "state_dir")
	set(&c.Build.NixStore, o.NixStore, "--nix-store", "build.nix_store")
	if o.Roles != nil {
		// Empty items are dropped so "a,b," works; nothing left is reported as empty roles.
		roles := []string{}
		for r := range strings.SplitSeq(*o.Roles, ",") {
			if r = strings.TrimSpace(r); r != "" {
				roles = append(roles, r)
			}
		}
		c.Node.Roles = roles
		from["node.roles"] = "--roles"
	}
}

// readTokens fills the tokens from the environment or, failing that, the token
// files. Relative file names are relative to the config file's directory, so a
// config and its token files can move together. Errors never include contents.
func (c *Config) readTokens(getenv func(string) string) []error {
	var errs []error
	read := func(dst *string, env, file, key string) {
		if v := trimToken(getenv(env)); v != "" {
			*dst = v
			return
		}
		if file == "" {
			return
		}
		if !filepath.IsAbs(file) && c.Source != "" {
			file = filepath.Join(filepath.Dir(c.Source), file)
		}
		if err := checkSecretFile(file); err != nil {
			errs = append(errs, fmt.Errorf("config: %s: %w", key, err))
			return
		}
		data, err := os.ReadFile(file)
		if err != nil {
			// Drop *PathError's "open FILE" prefix: the message names the file already.
			var pe *fs.PathError
			if errors.As(err, &pe) {
				err = pe.Err
			}
			errs = append(errs, fmt.Errorf("config: %s: read %s: %w", key, file, err))
			return
		}
		v := trimToken(string(data))
		if v == "" {
			errs = append(errs, fmt.Errorf("config: %s: %s is empty", key, file))
			return
		}
		*dst = v
	}
	read(&c.Auth.AdminToken, "HARMONIA_ADMIN_TOKEN", c.Auth.AdminTokenFile, "auth.admin_token_file")
	read(&c.Auth.ClusterSecret, "HARMONIA_CLUSTER_SECRET", c.Auth.ClusterSecretFile, "auth.cluster_secret_file")
	read(&c.Auth.NodeToken, "HARMONIA_NODE_TOKEN", c.Auth.NodeTokenFile, "auth.node_token_file")
	read(&c.Auth.Secret, "HARMONIA_AUTH_SECRET", c.Auth.SecretFile, "auth.secret_file")
	read(&c.Cache.S3.AccessKey, "HARMONIA_S3_ACCESS_KEY", c.Cache.S3.AccessKeyFile, "cache.s3.access_key_file")
	read(&c.Cache.S3.SecretKey, "HARMONIA_S3_SECRET_KEY", c.Cache.S3.SecretKeyFile, "cache.s3.secret_key_file")
	c.forgeSecrets(read)
	return errs
}

// trimToken drops the trailing newline editors and `echo` leave behind.
func trimToken(s string) string {
	return strings.TrimRightFunc(s, unicode.IsSpace)
}
