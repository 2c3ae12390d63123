//! Organisations, API keys, connectors and dashboard users, and the ledger's reads.

use callstream_actors::usage::{UsageEvent, UsageKind};

use super::{
    amount_u64, backend, connector_from, decode_event, exec, exec_raw, is_unique_violation,
    key_from, opt, rows, user_from, Params, PgStore, CONNECTOR_COLUMNS, KEY_BY_HASH, KEY_COLUMNS,
    ORG_BY_ID, ORG_COLUMNS, USER_COLUMNS,
};
use crate::store::{
    hex_to_hash, ApiKey, Connector, DashboardUser, DayUsage, Org, Store, StoreError,
};

impl PgStore {
    async fn update_connector(
        &self,
        client_id: &str,
        sql: &str,
        params: Params<'_>,
    ) -> Result<Connector, StoreError> {
        let conn = self.conn().await?;
        opt(&conn, sql, params)
            .await?
            .map(|r| connector_from(&r))
            .ok_or_else(|| StoreError::NotFound {
                kind: "connector",
                id: client_id.to_owned(),
            })
    }
}

#[async_trait::async_trait]
impl Store for PgStore {
    async fn insert_user(&self, user: &DashboardUser) -> Result<(), StoreError> {
        let conn = self.conn().await?;
        let inserted = exec(
            &conn,
            &format!(
                "INSERT INTO dashboard_users ({USER_COLUMNS}) VALUES ($1, $2, $3, $4)
                 ON CONFLICT DO NOTHING"
            ),
            &[
                &user.email,
                &user.org_id,
                &user.password_hash,
                &user.created_at_ms,
            ],
        )
        .await?;
        if inserted == 0 {
            return Err(StoreError::Exists {
                kind: "dashboard user",
                id: user.email.clone(),
            });
        }
        Ok(())
    }

    async fn user(&self, email: &str) -> Result<Option<DashboardUser>, StoreError> {
        let conn = self.conn().await?;
        let row = opt(
            &conn,
            &format!("SELECT {USER_COLUMNS} FROM dashboard_users WHERE email = $1"),
            &[&email],
        )
        .await?;
        Ok(row.as_ref().map(user_from))
    }

    async fn users(&self) -> Result<Vec<DashboardUser>, StoreError> {
        let conn = self.conn().await?;
        let rows = rows(
            &conn,
            &format!("SELECT {USER_COLUMNS} FROM dashboard_users ORDER BY created_at_ms, email"),
            &[],
        )
        .await?;
        Ok(rows.iter().map(user_from).collect())
    }

    async fn insert_org(&self, org: &Org) -> Result<(), StoreError> {
        let (mcp_url, sealed) = self.sealed_headers(org);
        let history = serde_json::to_string(&org.history)
            .expect("history settings are plain data and always serialize");
        let conn = self.conn().await?;
        let inserted = exec(
            &conn,
            &format!(
                "INSERT INTO orgs ({ORG_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
                 ON CONFLICT DO NOTHING"
            ),
            &[
                &org.id,
                &org.name,
                &org.system_prompt,
                &mcp_url,
                &sealed,
                &org.plan,
                &org.deleted,
                &org.created_at_ms,
                &org.mcp_allow,
                &history,
            ],
        )
        .await?;
        if inserted == 0 {
            return Err(StoreError::Exists {
                kind: "organisation",
                id: org.id.clone(),
            });
        }
        Ok(())
    }

    async fn update_org(&self, org: &Org) -> Result<(), StoreError> {
        let (mcp_url, sealed) = self.sealed_headers(org);
        let history = serde_json::to_string(&org.history)
            .expect("history settings are plain data and always serialize");
        let conn = self.conn().await?;
        let updated = exec(
            &conn,
            "UPDATE orgs SET name = $2, system_prompt = $3, mcp_url = $4,
                             mcp_headers_sealed = $5, plan = $6, deleted = $7,
                             created_at_ms = $8, mcp_allow = $9, history = $10
             WHERE id = $1",
            &[
                &org.id,
                &org.name,
                &org.system_prompt,
                &mcp_url,
                &sealed,
                &org.plan,
                &org.deleted,
                &org.created_at_ms,
                &org.mcp_allow,
                &history,
            ],
        )
        .await?;
        if updated == 0 {
            return Err(StoreError::NotFound {
                kind: "organisation",
                id: org.id.clone(),
            });
        }
        Ok(())
    }

    async fn org(&self, id: &str) -> Result<Option<Org>, StoreError> {
        let conn = self.conn().await?;
        let row = opt(&conn, ORG_BY_ID, &[&id]).await?;
        row.map(|r| self.org_from(&r)).transpose()
    }

    async fn orgs(&self) -> Result<Vec<Org>, StoreError> {
        let conn = self.conn().await?;
        let rows = rows(
            &conn,
            &format!("SELECT {ORG_COLUMNS} FROM orgs ORDER BY created_at_ms, id"),
            &[],
        )
        .await?;
        rows.iter().map(|r| self.org_from(r)).collect()
    }

    async fn insert_api_key(&self, key: &ApiKey, most: usize) -> Result<(), StoreError> {
        let hash = hex_to_hash(&key.hash).ok_or_else(|| {
            StoreError::Corrupt(key.id.clone(), "hash is not 64 hex digits".into())
        })?;
        let hash = hash.to_vec();
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await.map_err(backend)?;
        under_cap(&tx, "api_keys", "API key", &key.org_id, most).await?;
        let result = exec_raw(
            &tx,
            &format!("INSERT INTO api_keys ({KEY_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7)"),
            &[
                &key.id,
                &key.org_id,
                &key.name,
                &hash,
                &key.last4,
                &key.created_at_ms,
                &key.revoked_at_ms,
            ],
        )
        .await;
        match result {
            Ok(_) => tx.commit().await.map_err(backend),
            Err(e) if is_unique_violation(&e) => Err(StoreError::Exists {
                kind: "API key",
                id: key.id.clone(),
            }),
            Err(e) => Err(backend(e)),
        }
    }

    async fn revoke_api_key(&self, id: &str, at_ms: i64) -> Result<ApiKey, StoreError> {
        let conn = self.conn().await?;
        let row = opt(
            &conn,
            &format!(
                "UPDATE api_keys SET revoked_at_ms = COALESCE(revoked_at_ms, $2)
                 WHERE id = $1 RETURNING {KEY_COLUMNS}"
            ),
            &[&id, &at_ms],
        )
        .await?;
        row.map(|r| key_from(&r))
            .ok_or_else(|| StoreError::NotFound {
                kind: "API key",
                id: id.to_owned(),
            })
    }

    async fn api_key(&self, id: &str) -> Result<Option<ApiKey>, StoreError> {
        let conn = self.conn().await?;
        let row = opt(
            &conn,
            &format!("SELECT {KEY_COLUMNS} FROM api_keys WHERE id = $1"),
            &[&id],
        )
        .await?;
        Ok(row.as_ref().map(key_from))
    }

    async fn api_key_by_hash(&self, hash: &[u8; 32]) -> Result<Option<ApiKey>, StoreError> {
        let hash = hash.as_slice();
        let conn = self.conn().await?;
        let row = opt(&conn, KEY_BY_HASH, &[&hash]).await?;
        Ok(row.as_ref().map(key_from))
    }

    async fn api_keys(&self, org_id: &str) -> Result<Vec<ApiKey>, StoreError> {
        let conn = self.conn().await?;
        let rows = rows(
            &conn,
            &format!(
                "SELECT {KEY_COLUMNS} FROM api_keys WHERE org_id = $1 ORDER BY created_at_ms, id"
            ),
            &[&org_id],
        )
        .await?;
        Ok(rows.iter().map(key_from).collect())
    }

    async fn insert_connector(
        &self,
        connector: &Connector,
        secret: &[u8],
        most: usize,
    ) -> Result<(), StoreError> {
        let sealed = self.secrets.seal(&connector.client_id, secret);
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await.map_err(backend)?;
        under_cap(&tx, "connectors", "connector", &connector.org_id, most).await?;
        let inserted = exec(
            &tx,
            &format!(
                "INSERT INTO connectors ({CONNECTOR_COLUMNS}, secret_sealed)
                 VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT DO NOTHING"
            ),
            &[
                &connector.client_id,
                &connector.org_id,
                &connector.name,
                &connector.created_at_ms,
                &connector.rotated_at_ms,
                &connector.revoked_at_ms,
                &sealed,
            ],
        )
        .await?;
        if inserted == 0 {
            return Err(StoreError::Exists {
                kind: "connector",
                id: connector.client_id.clone(),
            });
        }
        tx.commit().await.map_err(backend)
    }

    async fn rotate_connector(
        &self,
        client_id: &str,
        secret: &[u8],
        at_ms: i64,
    ) -> Result<Connector, StoreError> {
        let sealed = self.secrets.seal(client_id, secret);
        self.update_connector(
            client_id,
            &format!(
                "UPDATE connectors SET secret_sealed = $2, rotated_at_ms = $3 WHERE client_id = $1
                 RETURNING {CONNECTOR_COLUMNS}"
            ),
            &[&client_id, &sealed, &at_ms],
        )
        .await
    }

    async fn revoke_connector(&self, client_id: &str, at_ms: i64) -> Result<Connector, StoreError> {
        self.update_connector(
            client_id,
            &format!(
                "UPDATE connectors SET revoked_at_ms = COALESCE(revoked_at_ms, $2)
                 WHERE client_id = $1 RETURNING {CONNECTOR_COLUMNS}"
            ),
            &[&client_id, &at_ms],
        )
        .await
    }

    async fn connector(&self, client_id: &str) -> Result<Option<(Connector, Vec<u8>)>, StoreError> {
        let conn = self.conn().await?;
        let row = opt(
            &conn,
            &format!(
                "SELECT {CONNECTOR_COLUMNS}, secret_sealed FROM connectors WHERE client_id = $1"
            ),
            &[&client_id],
        )
        .await?;
        let Some(row) = row else {
            return Ok(None);
        };
        let sealed: Vec<u8> = row.get(6);
        let secret = self.secrets.open(client_id, &sealed)?;
        Ok(Some((connector_from(&row), secret)))
    }

    async fn connectors(&self, org_id: &str) -> Result<Vec<Connector>, StoreError> {
        let conn = self.conn().await?;
        let rows = rows(
            &conn,
            &format!(
                "SELECT {CONNECTOR_COLUMNS} FROM connectors WHERE org_id = $1
                 ORDER BY created_at_ms, client_id"
            ),
            &[&org_id],
        )
        .await?;
        Ok(rows.iter().map(connector_from).collect())
    }

    async fn usage_by_day(
        &self,
        org_id: &str,
        from: &str,
        to: &str,
    ) -> Result<Vec<DayUsage>, StoreError> {
        let conn = self.conn().await?;
        let rows = rows(
            &conn,
            "SELECT day, kind, amount FROM usage_daily
             WHERE org_id = $1 AND day >= $2 AND day <= $3 ORDER BY day, kind",
            &[&org_id, &from, &to],
        )
        .await?;
        rows.iter()
            .map(|row| {
                let tag: i16 = row.get(1);
                let kind = u8::try_from(tag)
                    .ok()
                    .and_then(UsageKind::from_tag)
                    .ok_or_else(|| {
                        StoreError::Corrupt("daily usage".into(), format!("kind {tag}"))
                    })?;
                Ok(DayUsage {
                    day: row.get(0),
                    kind,
                    amount: amount_u64(row.get(2)),
                })
            })
            .collect()
    }

    async fn usage_events(
        &self,
        org_id: &str,
        from_ms: i64,
        to_ms: i64,
    ) -> Result<Vec<UsageEvent>, StoreError> {
        let conn = self.conn().await?;
        let rows = rows(
            &conn,
            "SELECT event FROM usage_ledger
             WHERE org_id = $1 AND at_ms >= $2 AND at_ms < $3 ORDER BY at_ms, seq",
            &[&org_id, &from_ms, &to_ms],
        )
        .await?;
        rows.iter().map(|row| decode_event(row.get(0))).collect()
    }
}

/// Checks, inside `tx` and under a lock per organisation and table held until `tx` ends, that
/// `org_id` has fewer than `most` rows of `table` not revoked: two instances adding at once
/// take turns, so the cap holds in total.
async fn under_cap(
    tx: &deadpool_postgres::Transaction<'_>,
    table: &'static str,
    kind: &'static str,
    org_id: &str,
    most: usize,
) -> Result<(), StoreError> {
    exec(
        tx,
        "SELECT pg_advisory_xact_lock(hashtextextended('cap/' || $1 || '/' || $2, 0))",
        &[&table, &org_id],
    )
    .await?;
    let live: i64 = opt(
        tx,
        &format!("SELECT count(*) FROM {table} WHERE org_id = $1 AND revoked_at_ms IS NULL"),
        &[&org_id],
    )
    .await?
    .map_or(0, |row| row.get(0));
    if usize::try_from(live).unwrap_or(usize::MAX) >= most {
        return Err(StoreError::Cap { kind, most });
    }
    Ok(())
}
