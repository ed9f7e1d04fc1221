package webhook

// sqlRepositoryForgeID is the recorded forge id of a forge's repository (NULL: not recorded).
// $1 forge, $2 full name.
const sqlRepositoryForgeID = `SELECT forge_id FROM repositories WHERE forge = $1 AND full_name = $2`
