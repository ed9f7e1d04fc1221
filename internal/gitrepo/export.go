package gitrepo

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// Export writes the tree of commit into dir, which must not exist yet, as `git archive` has it
// (files marked export-ignore in .gitattributes left out, no submodules, no .git): the project's
// files as a checkout of that commit would show them. Directories are 0755 and files 0644 or,
// if executable, 0755, so that another user may read them; the rest is left to dir's owner.
func (m *Mirror) Export(ctx context.Context, commit, dir string) error {
	if err := validateRev(commit); err != nil {
		return err
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		return fmt.Errorf("export %s: %w", commit, err)
	}
	cmd, stderr := command(ctx, nil, m.Dir, "", "archive", "--format=tar", "--end-of-options", commit)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return fmt.Errorf("export %s: %w", commit, err)
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("export %s: %w", commit, err)
	}
	xerr := extract(out, dir)
	_, _ = io.Copy(io.Discard, out) // let git finish, whatever extract made of it
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("export %s: %w", commit, commandError(ctx, "archive", stderr, err))
	}
	if xerr != nil {
		return fmt.Errorf("export %s: %w", commit, xerr)
	}
	return nil
}

// extract unpacks the tar stream of `git archive` into dir: directories, regular files and
// symbolic links, each inside dir.
func extract(r io.Reader, dir string) error {
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		name := filepath.Clean(filepath.FromSlash(h.Name))
		if name == "." {
			continue
		}
		if filepath.IsAbs(name) || name == ".." || strings.HasPrefix(name, ".."+string(filepath.Separator)) {
			return fmt.Errorf("the archive has a path outside the tree: %q", h.Name)
		}
		p := filepath.Join(dir, name)
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.Mkdir(p, 0o755); err != nil {
				return err
			}
			if err := os.Chmod(p, 0o755); err != nil { // the umask may have taken bits
				return err
			}
		case tar.TypeReg:
			mode := os.FileMode(0o644)
			if h.Mode&0o111 != 0 {
				mode = 0o755
			}
			if err := writeFile(p, tr, mode); err != nil {
				return err
			}
		case tar.TypeSymlink:
			// Link targets are the repository's; what they point at is the reader's to check.
			if err := os.Symlink(h.Linkname, p); err != nil {
				return err
			}
		case tar.TypeXGlobalHeader:
			// git archive's pax header naming the commit.
		default:
			return fmt.Errorf("unexpected entry %q of type %q in the archive", h.Name, h.Typeflag)
		}
	}
}

func writeFile(p string, r io.Reader, mode os.FileMode) error {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Chmod(p, mode) // the umask may have taken bits the reader needs
}
