package gitrepo

import (
	"strings"
	"testing"
)

func TestValidateURL(t *testing.T) {
	tests := []struct {
		url     string
		wantErr string // substring; "" means valid
	}{
		{"/srv/git/repo.git", ""},
		{"/srv/git/we:ird", ""},
		{"file:///srv/git/repo.git", ""},
		{"https://github.com/owner/repo.git", ""},
		{"http://git.example.com/repo", ""},
		{"HTTPS://github.com/owner/repo", ""},
		{"https://user:token@github.com/owner/repo", ""},
		{"ssh://git@example.com:2222/owner/repo.git", ""},
		{"ssh://[::1]/repo.git", ""},
		{"git://example.com/repo.git", ""},
		{"git@github.com:owner/repo.git", ""},
		{"myhost:repo.git", ""},

		{"", "empty"},
		{"repo", "relative path"},
		{"./repo", "relative path"},
		{"../repo", "relative path"},
		{"dir/with:colon", "relative path"},
		{"-uupload-pack=touch /tmp/x", "start with '-'"},
		{"--upload-pack=x", "start with '-'"},
		{"/srv/repo\n", "control character"},
		{"https://example.com/\x00", "control character"},
		{"ext::sh -c touch% /tmp/pwned", `transport "ext"`},
		{"fd::3", `transport "fd"`},
		{"myhost::repo", `transport "myhost"`},
		{"ftp://example.com/repo", `unsupported scheme "ftp"`},
		{"git+ssh://example.com/repo", `unsupported scheme "git+ssh"`},
		{"https://", "empty host"},
		{"https:///path", "empty host"},
		{"ssh://-oProxyCommand=x/repo", "host must not start with '-'"},
		{"ssh://-oProxyCommand=x@host/repo", "user must not start with '-'"},
		{"file://host/srv/repo", "file URL with host"},
		{"file://", "empty path"},
		{"git@-oProxyCommand=x:repo", "host must not start with '-'"},
		{"git@:repo", "empty host"},
		{"@host:repo", "empty user"},
		{"git@host:", "empty path"},
		{"git@[::1]:repo", "invalid host"},
	}
	for _, tt := range tests {
		t.Run(tt.url, func(t *testing.T) {
			err := ValidateURL(tt.url)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("ValidateURL(%q) = %v, want nil", tt.url, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("ValidateURL(%q) = %v, want error containing %q", tt.url, err, tt.wantErr)
			}
		})
	}
}

func TestValidateBranch(t *testing.T) {
	tests := []struct {
		branch  string
		wantErr string // substring; "" means valid
	}{
		{"main", ""},
		{"feature/login", ""},
		{"release-1.0", ""},
		{"a.b_c+d=e,f", ""},
		{"ünïcode", ""},
		{"user@host", ""},
		{"HEADS-UP", ""},
		{strings.Repeat("a", maxBranchLen), ""},

		{"", "empty"},
		{strings.Repeat("a", maxBranchLen+1), "longer than"},
		{"@", "not a valid branch name"},
		{"-rf", "start with '-'"},
		{"/main", "start or end with '/'"},
		{"main/", "start or end with '/'"},
		{"main.", "end with '.'"},
		{"a..b", `".."`},
		{"a//b", `"//"`},
		{"main@{1}", `"@{"`},
		{"with space", `' '`},
		{"tab\there", `'\t'`},
		{"del\x7f", `'\x7f'`},
		{"a~1", `'~'`},
		{"a^", `'^'`},
		{"a:b", `':'`},
		{"a?", `'?'`},
		{"a*", `'*'`},
		{"a[0", `'['`},
		{`a\b`, `'\\'`},
		{".hidden", "starts with '.'"},
		{"feature/.hidden", "starts with '.'"},
		{"main.lock", `ends with ".lock"`},
		{"a.lock/b", `ends with ".lock"`},
	}
	for _, tt := range tests {
		t.Run(tt.branch, func(t *testing.T) {
			err := ValidateBranch(tt.branch)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("ValidateBranch(%q) = %v, want nil", tt.branch, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("ValidateBranch(%q) = %v, want error containing %q", tt.branch, err, tt.wantErr)
			}
		})
	}
}

func TestValidatePath(t *testing.T) {
	tests := []struct {
		path    string
		wantErr string // substring; "" means valid
	}{
		{"flake.nix", ""},
		{"nix/ci/default.nix", ""},
		{".github/workflows/ci.yml", ""},
		{"with space.txt", ""},
		{"a..b", ""},

		{"", "empty"},
		{"/etc/passwd", "relative"},
		{"-n", "start with '-'"},
		{"../secret", `".."`},
		{"a/../../b", `".."`},
		{"./flake.nix", "not clean"},
		{"a//b", "not clean"},
		{"dir/", "not clean"},
		{"a\nb", "control character"},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			err := validatePath(tt.path)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("validatePath(%q) = %v, want nil", tt.path, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("validatePath(%q) = %v, want error containing %q", tt.path, err, tt.wantErr)
			}
		})
	}
}
