from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("broker", "0007_links"),
    ]

    operations = [
        migrations.CreateModel(
            name="ClusterLease",
            fields=[
                ("name", models.CharField(max_length=200, primary_key=True, serialize=False)),
                ("holder", models.CharField(blank=True, max_length=200)),
                ("expires_at", models.DateTimeField()),
                ("acquired_at", models.DateTimeField(blank=True, null=True)),
            ],
            options={"db_table": "broker_cluster_lease"},
        ),
    ]
