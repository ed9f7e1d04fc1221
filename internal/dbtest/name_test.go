package dbtest

import "testing"

func TestDBName(t *testing.T) {
	for _, c := range []struct {
		in   string
		want string
	}{
		{"TestFoo", "t_testfoo_7"},
		{"TestFoo/sub case#01", "t_testfoo_sub_case_01_7"},
		{"Test__Ünïcode--x", "t_test_n_code_x_7"},
		{"TestAVeryLongNameThatGoesOnAndOnAndOnForeverAndEver/sub", "t_testaverylongnamethatgoesonandonandonfor_7"},
	} {
		if got := dbName(c.in, 7); got != c.want {
			t.Errorf("dbName(%q) = %q, want %q", c.in, got, c.want)
		}
		if got := dbName(c.in, 7); len(got) > 63 {
			t.Errorf("dbName(%q) is %d bytes, over PostgreSQL's 63", c.in, len(got))
		}
	}
}
