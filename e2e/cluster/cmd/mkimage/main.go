// Command mkimage writes a single-layer OCI image archive (an OCI image layout in a tar), the form
// `ctr images import` takes, from files on this machine. No registry and no Docker daemon are
// involved, and the output is reproducible: every timestamp is zero and entries are sorted.
//
//	mkimage --name docker.io/rocefabric/rocefabric-node:0.1.0 --out node.tar \
//	    --file /path/on/host:/usr/local/bin/x --symlink /bin/sh:busybox --dir /tmp:1777 \
//	    --entrypoint /usr/local/bin/x --cmd serve --user 65532:65532 --env K=V \
//	    --fcap /usr/local/bin/x:ipc_lock
//
// --fcap gives a file of the image a file capability, permitted only (what `setcap cap_X=p` sets):
// the layer carries it as the security.capability extended attribute, which containerd sets when
// it unpacks the layer.
package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"
)

type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(v string) error { *l = append(*l, v); return nil }

// entry is one file, directory or symlink of the layer, by its path in the image.
type entry struct {
	name     string
	typeflag byte
	mode     int64
	source   string // host file, for regular files
	linkname string // for symlinks
	fcap     string // security.capability value (vfs_cap_data), for regular files
}

// capabilityBits are the capabilities --fcap knows, by their number in linux/capability.h.
var capabilityBits = map[string]uint{"net_admin": 12, "net_raw": 13, "ipc_lock": 14, "sys_admin": 21, "sys_resource": 24}

// fileCapability is a vfs_cap_data, revision 2: magic and flags (no effective bit, so exec never
// fails where the capability is not in the bounding set: the program raises it itself), then
// permitted and inheritable for capabilities 0-31 and 32-63, little-endian.
func fileCapability(names string) (string, error) {
	var permitted uint64
	for _, n := range strings.Split(names, ",") {
		bit, ok := capabilityBits[strings.TrimPrefix(strings.ToLower(n), "cap_")]
		if !ok {
			return "", fmt.Errorf("unknown capability %q", n)
		}
		permitted |= 1 << bit
	}
	b := make([]byte, 20)
	binary.LittleEndian.PutUint32(b[0:], 0x02000000)
	binary.LittleEndian.PutUint32(b[4:], uint32(permitted))
	binary.LittleEndian.PutUint32(b[12:], uint32(permitted>>32))
	return string(b), nil
}

func main() {
	var files, symlinks, dirs, entrypoint, cmd, env, fcaps list
	name := flag.String("name", "", "image reference, e.g. docker.io/library/busybox:local")
	out := flag.String("out", "", "the archive to write")
	user := flag.String("user", "", "user[:group] the image runs as")
	workdir := flag.String("workdir", "/", "working directory")
	flag.Var(&files, "file", "HOST:IMAGE[:MODE] a regular file (mode octal; default: the host file's)")
	flag.Var(&symlinks, "symlink", "IMAGE:TARGET a symbolic link")
	flag.Var(&dirs, "dir", "IMAGE[:MODE] a directory (mode octal; default 0755)")
	flag.Var(&entrypoint, "entrypoint", "entrypoint word (repeat for each)")
	flag.Var(&cmd, "cmd", "default argument (repeat for each)")
	flag.Var(&env, "env", "KEY=VALUE (repeat)")
	flag.Var(&fcaps, "fcap", "IMAGE:CAP[,CAP] file capabilities of a --file, permitted only (setcap cap_X=p)")
	flag.Parse()
	if *name == "" || *out == "" {
		fail("--name and --out are required")
	}
	entries, err := collect(files, symlinks, dirs)
	if err != nil {
		fail(err.Error())
	}
	if err := setCapabilities(entries, fcaps); err != nil {
		fail(err.Error())
	}
	if err := write(*name, *out, entries, config{user: *user, workdir: *workdir, entrypoint: entrypoint, cmd: cmd, env: env}); err != nil {
		fail(err.Error())
	}
}

func fail(msg string) {
	fmt.Fprintf(os.Stderr, "mkimage: %s\n", msg)
	os.Exit(1)
}

func collect(files, symlinks, dirs list) ([]entry, error) {
	byName := map[string]entry{}
	add := func(e entry) error {
		e.name = strings.TrimPrefix(path.Clean("/"+e.name), "/")
		if e.name == "" {
			return fmt.Errorf("empty path in the image")
		}
		if old, ok := byName[e.name]; ok && old != e {
			return fmt.Errorf("%s given twice", e.name)
		}
		byName[e.name] = e
		// Parent directories, so every entry has one.
		for dir := path.Dir(e.name); dir != "." && dir != "/"; dir = path.Dir(dir) {
			if _, ok := byName[dir]; !ok {
				byName[dir] = entry{name: dir, typeflag: tar.TypeDir, mode: 0o755}
			}
		}
		return nil
	}
	for _, f := range files {
		parts := strings.Split(f, ":")
		if len(parts) < 2 || len(parts) > 3 {
			return nil, fmt.Errorf("--file %q: want HOST:IMAGE[:MODE]", f)
		}
		info, err := os.Stat(parts[0])
		if err != nil {
			return nil, fmt.Errorf("--file %q: %w", f, err)
		}
		if !info.Mode().IsRegular() {
			return nil, fmt.Errorf("--file %q: %s is not a regular file", f, parts[0])
		}
		mode := int64(info.Mode().Perm())
		if len(parts) == 3 {
			if mode, err = strconv.ParseInt(parts[2], 8, 32); err != nil {
				return nil, fmt.Errorf("--file %q: mode: %w", f, err)
			}
		}
		if err := add(entry{name: parts[1], typeflag: tar.TypeReg, mode: mode, source: parts[0]}); err != nil {
			return nil, err
		}
	}
	for _, s := range symlinks {
		image, target, ok := strings.Cut(s, ":")
		if !ok || target == "" {
			return nil, fmt.Errorf("--symlink %q: want IMAGE:TARGET", s)
		}
		if err := add(entry{name: image, typeflag: tar.TypeSymlink, mode: 0o777, linkname: target}); err != nil {
			return nil, err
		}
	}
	for _, d := range dirs {
		image, modeText, hasMode := strings.Cut(d, ":")
		mode := int64(0o755)
		if hasMode {
			var err error
			if mode, err = strconv.ParseInt(modeText, 8, 32); err != nil {
				return nil, fmt.Errorf("--dir %q: mode: %w", d, err)
			}
		}
		delete(byName, strings.TrimPrefix(path.Clean("/"+image), "/")) // an explicit mode wins over an implied parent
		if err := add(entry{name: image, typeflag: tar.TypeDir, mode: mode}); err != nil {
			return nil, err
		}
	}
	entries := make([]entry, 0, len(byName))
	for _, e := range byName {
		entries = append(entries, e)
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].name < entries[j].name })
	return entries, nil
}

// setCapabilities gives each --fcap's file its capabilities; the file must be a --file.
func setCapabilities(entries []entry, fcaps list) error {
	for _, f := range fcaps {
		image, names, ok := strings.Cut(f, ":")
		if !ok || names == "" {
			return fmt.Errorf("--fcap %q: want IMAGE:CAP[,CAP]", f)
		}
		name := strings.TrimPrefix(path.Clean("/"+image), "/")
		value, err := fileCapability(names)
		if err != nil {
			return fmt.Errorf("--fcap %q: %w", f, err)
		}
		found := false
		for i := range entries {
			if entries[i].name == name && entries[i].typeflag == tar.TypeReg {
				entries[i].fcap, found = value, true
			}
		}
		if !found {
			return fmt.Errorf("--fcap %q: no --file at %s", f, image)
		}
	}
	return nil
}

type config struct {
	user, workdir        string
	entrypoint, cmd, env list
}

// layer returns the gzipped layer and the sha256 of its uncompressed tar (the diff id).
func layer(entries []entry) (gz []byte, diffID string, err error) {
	var raw bytes.Buffer
	tw := tar.NewWriter(&raw)
	for _, e := range entries {
		hdr := &tar.Header{Name: e.name, Typeflag: e.typeflag, Mode: e.mode, Linkname: e.linkname,
			ModTime: time.Unix(0, 0), Format: tar.FormatPAX}
		if e.typeflag == tar.TypeDir {
			hdr.Name += "/"
		}
		if e.fcap != "" {
			hdr.PAXRecords = map[string]string{"SCHILY.xattr.security.capability": e.fcap}
		}
		var body []byte
		if e.typeflag == tar.TypeReg {
			if body, err = os.ReadFile(e.source); err != nil {
				return nil, "", err
			}
			hdr.Size = int64(len(body))
		}
		if err = tw.WriteHeader(hdr); err != nil {
			return nil, "", err
		}
		if _, err = tw.Write(body); err != nil {
			return nil, "", err
		}
	}
	if err = tw.Close(); err != nil {
		return nil, "", err
	}
	diffID = digest(raw.Bytes())
	var compressed bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&compressed, gzip.BestSpeed)
	if _, err = io.Copy(zw, &raw); err != nil {
		return nil, "", err
	}
	if err = zw.Close(); err != nil {
		return nil, "", err
	}
	return compressed.Bytes(), diffID, nil
}

func digest(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

func descriptor(mediaType string, blob []byte, annotations map[string]string) map[string]any {
	d := map[string]any{"mediaType": mediaType, "digest": digest(blob), "size": len(blob)}
	if annotations != nil {
		d["annotations"] = annotations
	}
	return d
}

func write(name, out string, entries []entry, c config) error {
	layerBlob, diffID, err := layer(entries)
	if err != nil {
		return err
	}
	imageConfig := map[string]any{"WorkingDir": c.workdir}
	if c.user != "" {
		imageConfig["User"] = c.user
	}
	if len(c.entrypoint) > 0 {
		imageConfig["Entrypoint"] = []string(c.entrypoint)
	}
	if len(c.cmd) > 0 {
		imageConfig["Cmd"] = []string(c.cmd)
	}
	envs := append([]string{"PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"}, c.env...)
	imageConfig["Env"] = envs
	configBlob, err := json.Marshal(map[string]any{
		"architecture": "amd64", "os": "linux", "created": "1970-01-01T00:00:00Z",
		"config": imageConfig,
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{diffID}},
	})
	if err != nil {
		return err
	}
	manifestBlob, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.manifest.v1+json",
		"config":        descriptor("application/vnd.oci.image.config.v1+json", configBlob, nil),
		"layers":        []any{descriptor("application/vnd.oci.image.layer.v1.tar+gzip", layerBlob, nil)},
	})
	if err != nil {
		return err
	}
	tag := name[strings.LastIndex(name, ":")+1:]
	index, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.index.v1+json",
		"manifests": []any{descriptor("application/vnd.oci.image.manifest.v1+json", manifestBlob, map[string]string{
			"io.containerd.image.name":          name,
			"org.opencontainers.image.ref.name": tag,
		})},
	})
	if err != nil {
		return err
	}
	file, err := os.Create(out + ".tmp")
	if err != nil {
		return err
	}
	tw := tar.NewWriter(file)
	put := func(name string, body []byte) error {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(body)), ModTime: time.Unix(0, 0)}); err != nil {
			return err
		}
		_, err := tw.Write(body)
		return err
	}
	blob := func(b []byte) string { return "blobs/sha256/" + strings.TrimPrefix(digest(b), "sha256:") }
	for _, f := range []struct {
		name string
		body []byte
	}{
		{"oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)},
		{"index.json", index},
		{blob(manifestBlob), manifestBlob},
		{blob(configBlob), configBlob},
		{blob(layerBlob), layerBlob},
	} {
		if err := put(f.name, f.body); err != nil {
			file.Close()
			return err
		}
	}
	if err := tw.Close(); err != nil {
		file.Close()
		return err
	}
	if err := file.Close(); err != nil {
		return err
	}
	return os.Rename(out+".tmp", out)
}
